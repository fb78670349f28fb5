#!/usr/bin/env bash
# The optimizer family on Fashion-MNIST in the demo's set-up (deploy/demo.json: 4 workers,
# 2 parameter-server shards, 600 steps x 64 samples, warmup 100): Adam, 1-bit Adam, 0/1
# Adam (DeepSpeed's defaults, and with local steps that double to 8 every 100; each also
# with bias_correction, and Adam with it as their baseline), 1-bit LAMB, each with the
# onebit and the int8 compressor; and 1-bit Adam at eps 1e-8 without and
# with the automatic momentum mask. Each run once per seed in SEEDS (default "1 2 3": one
# seed's accuracy moves by about a point with the chunking alone). Prints a markdown table
# (mean test accuracy and its range over the seeds, bytes, steps that communicated) and
# leaves every run's logs and summaries in OUT (default out/bench-family), the table in
# OUT/table.md.
#
#   [SEEDS="1 2 3"] bash tools/bench/family.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-out/bench-family}"
seeds="${SEEDS:-1 2 3}"
mkdir -p "$out"
bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch //worker:onebit-worker \
  //coordinator:onebit-coordinator //server:onebit-server >/dev/null 2>&1 ||
  bazel build //deploy:onebit-launch //worker:onebit-worker //coordinator:onebit-coordinator \
    //server:onebit-server

# name|optimizer type|params (JSON)|compressor|extra onebit keys (JSON)
runs=(
  'adam|Adam|{"lr":0.001,"eps":1e-5}|onebit|{}'
  'adam_bias_correction|Adam|{"lr":0.001,"eps":1e-5,"bias_correction":true}|onebit|{}'
  'onebit_adam|OneBitAdam|{"lr":0.001,"eps":1e-5,"freeze_step":100}|onebit|{}'
  'onebit_adam_int8|OneBitAdam|{"lr":0.001,"eps":1e-5,"freeze_step":100}|int8|{}'
  'zero_one_adam|ZeroOneAdam|{"lr":0.001,"eps":1e-5,"var_freeze_step":100}|onebit|{}'
  'zero_one_adam_bias_correction|ZeroOneAdam|{"lr":0.001,"eps":1e-5,"var_freeze_step":100,"bias_correction":true}|onebit|{}'
  'zero_one_adam_local|ZeroOneAdam|{"lr":0.001,"eps":1e-5,"var_freeze_step":100,"local_step_scaler":100,"local_step_clipper":8}|onebit|{}'
  'zero_one_adam_local_bias_correction|ZeroOneAdam|{"lr":0.001,"eps":1e-5,"var_freeze_step":100,"local_step_scaler":100,"local_step_clipper":8,"bias_correction":true}|onebit|{}'
  'zero_one_adam_local_int8|ZeroOneAdam|{"lr":0.001,"eps":1e-5,"var_freeze_step":100,"local_step_scaler":100,"local_step_clipper":8}|int8|{}'
  'onebit_lamb|OneBitLamb|{"lr":0.005,"eps":1e-5,"freeze_step":100}|onebit|{}'
  'onebit_lamb_int8|OneBitLamb|{"lr":0.005,"eps":1e-5,"freeze_step":100}|int8|{}'
  'onebit_adam_eps1e-8|OneBitAdam|{"lr":0.001,"eps":1e-8,"freeze_step":100}|onebit|{}'
  'onebit_adam_eps1e-8_auto_mask|OneBitAdam|{"lr":0.001,"eps":1e-8,"freeze_step":100}|onebit|{"momentum_mask":{"auto_zero_grad":true}}'
)

for seed in $seeds; do
for run in "${runs[@]}"; do
  IFS='|' read -r name type params compressor extra <<<"$run"
  name="$name.seed$seed"
  python3 - "$out/$name.json" "$type" "$params" "$compressor" "$extra" "$seed" <<'PY'
import json, sys
path, type_, params, compressor, extra, seed = sys.argv[1:]
c = json.load(open("deploy/demo.json"))
c["seed"] = int(seed)
p = {"betas": [0.9, 0.999], "weight_decay": 0, "comm_backend_name": "gloo"}
p.update(json.loads(params))
c["optimizer"] = {"type": type_, "params": p}
c["onebit"]["exchange"]["compressor"] = compressor
c["onebit"]["log_every"] = 100
c["onebit"]["workload"]["eval_every"] = 600
c["onebit"]["failure"] = {"max_restarts": 0}  # a diverged run fails at once
c["onebit"].update(json.loads(extra))
json.dump(c, open(path, "w"), indent=1)
PY
  echo "== $name" >&2
  rm -rf "$out/$name"
  if "${BIN_DIR:-bazel-bin}"/deploy/onebit-launch --config="$out/$name.json" --out_dir="$out/$name" \
       --bin_dir="${BIN_DIR:-bazel-bin}" --echo_all=false --compare_adam=false >"$out/$name.log" 2>&1; then
    echo "   done" >&2
  else
    echo "   failed: $(grep -ho 'training diverged[^;]*' "$out/$name"/onebit_adam/worker-*.log | head -1)" >&2
  fi
done
done

python3 - "$out" "$seeds" "${runs[@]}" <<'PY' | tee "$out/table.md"
import glob, json, os, re, sys
out, seeds, runs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
print(f"| run | optimizer | compressor | test accuracy, mean of seeds {' '.join(seeds)} (range) | vs Adam | MB sent per worker | vs Adam | steps that communicated | masked |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
base = None
for run in runs:
    name, type_, params, compressor, extra = run.split("|")
    accs, mbs, failures, w0 = [], [], [], None
    for seed in seeds:
        d = os.path.join(out, f"{name}.seed{seed}", "onebit_adam")
        files = sorted(glob.glob(os.path.join(d, "worker-*.json")))
        if not files:
            logs = " ".join(open(f).read() for f in glob.glob(os.path.join(d, "worker-*.log")))
            m = re.search(r"training diverged: the loss is nan at step (\d+)", logs)
            failures.append(f"diverged at step {m.group(1)}" if m else "failed")
            continue
        w = [json.load(open(f)) for f in files]
        w0 = w[0]
        accs.append(w[0]["test_accuracy"] * 100)
        mbs.append(sum(x["bytes_sent_warmup"] + x["bytes_sent_compression"] for x in w) / len(w) / 1e6)
    if not accs:
        print(f"| {name} | {type_} | {compressor} | {', '.join(failures)} | | | | | |")
        continue
    acc, mb = sum(accs) / len(accs), sum(mbs) / len(mbs)
    if base is None and type_ == "Adam":
        base = (acc, mb)
    dacc = f"{acc - base[0]:+.2f}" if base else ""
    ratio = f"{base[1] / mb:.1f}x fewer" if base else ""
    comm = w0["steps_communicated_warmup"] + w0["steps_communicated_compression"]
    steps = w0["warmup_steps"] + w0["compression_steps"]
    note = f" ({len(failures)} failed)" if failures else ""
    print(f"| {name} | {type_} | {compressor} | {acc:.2f}% ({min(accs):.2f}-{max(accs):.2f}){note} | {dacc} | {mb:.1f} | {ratio} | {comm} of {steps} | {w0.get('masked_elements', 0)} |")
PY

# Training loss of the first seed's runs (worker 0, mean of 20 steps), one curve per
# optimizer and compressor, into OUT/loss.png.
if command -v gnuplot >/dev/null 2>&1; then
  seed="${seeds%% *}"
  plots=()
  # One colour per optimizer configuration; int8 dashed, bias_correction dotted.
  colours=(black '#1f77b4' '#d62728' '#2ca02c' '#9467bd' '#ff7f0e' '#8c564b' '#17becf')
  declare -A colour_of=()
  for run in "${runs[@]}"; do
    IFS='|' read -r name _ _ _ _ <<<"$run"
    csv="$out/$name.seed$seed/onebit_adam/worker-0.csv"
    [[ -s "$csv" && -s "$out/$name.seed$seed/onebit_adam/worker-0.json" ]] || continue
    base="${name%_int8}"
    base="${base%_bias_correction}"
    [[ -n "${colour_of[$base]:-}" ]] || colour_of[$base]="${colours[${#colour_of[@]} % ${#colours[@]}]}"
    dash=1
    [[ "$name" == *_int8 ]] && dash=2
    [[ "$name" == *_bias_correction ]] && dash=3
    plots+=("'$csv' using 1:(stringcolumn(2) eq 'step' ? sm(\$4, \$1) : 1/0) with lines lw 2 lc rgb '${colour_of[$base]}' dt $dash title '$name'")
  done
  (IFS=,; gnuplot <<GP
set terminal pngcairo size 1000,550 font ',10' noenhanced
set output '$out/loss.png'
set datafile separator ','
set title 'Fashion-MNIST MLP, 4 workers, 2 shards: training loss of worker 0 (mean of 20 steps, seed $seed)'
set xlabel 'step'
set ylabel 'loss'
set yrange [0.2:1.0]
set grid
set key top right
array w[20]
sm(x, n) = (w[int(n)%20+1] = x, n < 19 ? x : (sum [i=1:20] w[i]) / 20.0)
plot ${plots[*]}
GP
  ) && echo "loss curves: $out/loss.png"
fi
