# shellcheck shell=bash
# What the examples' run.sh and sweep.sh share (sourced, with HERE set to the example's
# folder). The functions read HERE, ROOT, PY, OUT and RESULTS; run.sh sets them with
# example_setup, sweep.sh and tests/examples_test.sh with their own.
#
#   example_setup                ROOT and PY from HERE; OUT, RESULTS and OVERRIDE from STEPS
#                                (env, default 0): STEPS > 0, a smoke test into
#                                HERE/out/smoke; else the full run, HERE/out/full, its
#                                results in ROOT/results/EXAMPLE
#   job_config SRC DST [K=V...]  DST: the job config SRC with each K (a dotted path) set to
#                                V (JSON); prints its worker count
#   example_job STEPS            OUT/job.json: HERE/job.json, with STEPS steps (freeze at
#                                half) when STEPS > 0; prints the job's worker count
#   build_onebit                 onebit's extension, //python:libonebit_core.so
#   onebit_train DIR N ARGS...   HERE/train.py ARGS as torchrun launches it in N processes
#                                (onebit-run, its stand-in on one machine): rank 0 runs the
#                                job's coordinator; every rank's history CSV in DIR
#   launch_onebit ARGS...        onebit_train of OUT/job.json (example_job OVERRIDE), after
#                                build_onebit: every rank's history CSV and summary in
#                                OUT/onebit_adam, the output also in OUT/onebit.log
#   onebit_summary               RESULTS/onebit_summary.txt: rank 0's bytes per stage
#   result_field FILE KEY FMT [SCALE]
#                                a result JSON's KEY times SCALE (1 if not given), printed
#                                with the %-format FMT
#   freeze_step                  OUT/job.json's freeze_step
#   loss_plot DECAY WEIGHT       gnuplot: the freeze step's line and both runs' training loss
#                                of rank 0 (EMA: DECAY * average + WEIGHT * loss) by step

example_setup() {
  ROOT="$(cd "$HERE/../.." && pwd)"
  PY=/usr/bin/python3  # Debian's python3-torch (the pyenv python3 on PATH has no torch)
  STEPS="${STEPS:-0}"
  if [ "$STEPS" -gt 0 ]; then
    OUT="$HERE/out/smoke"; RESULTS="$OUT/results"; OVERRIDE="$STEPS"
  else
    OUT="$HERE/out/full"; RESULTS="$ROOT/results/$(basename "$HERE")"; OVERRIDE=0
  fi
  mkdir -p "$OUT" "$RESULTS"
}

job_config() {
  "$PY" - "$@" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    key, value = kv.split("=", 1)
    *path, last = key.split(".")
    node = job
    for p in path:
        node = node.setdefault(p, {})
    node[last] = json.loads(value)
json.dump(job, open(sys.argv[2], "w"), indent=1)
print(job["onebit"]["workers"])
PY
}

example_job() {
  if [ "$1" -gt 0 ]; then
    job_config "$HERE/job.json" "$OUT/job.json" "steps=$1" "optimizer.params.freeze_step=$(($1 / 2))"
  else
    job_config "$HERE/job.json" "$OUT/job.json"
  fi
}

build_onebit() {
  # The wheel's extension, when pip-installed, serves as well. The project machines share a
  # disk cache; a fresh machine builds without one.
  (cd "$ROOT" && { bazel build --disk_cache=/work/.bazel-disk-cache //python:libonebit_core.so \
    2>/dev/null || bazel build //python:libonebit_core.so; })
}

onebit_train() {
  local dir="$1" workers="$2"
  shift 2
  PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" \
    ONEBIT_HISTORY_CSV="$dir/worker-{rank}.csv" \
    "$PY" -m onebit.run --nproc_per_node="$workers" --master_port=0 "$HERE/train.py" "$@"
}

launch_onebit() {
  local workers
  workers="$(example_job "$OVERRIDE")"
  build_onebit
  rm -rf "$OUT/onebit_adam" && mkdir -p "$OUT/onebit_adam"
  ONEBIT_SUMMARY_FILE="$OUT/onebit_adam/summary-{rank}.json" \
    onebit_train "$OUT/onebit_adam" "$workers" --config="$OUT/job.json" "$@" |
    tee "$OUT/onebit.log"
}

onebit_summary() {
  "$PY" - "$OUT/onebit_adam/summary-0.json" > "$RESULTS/onebit_summary.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("1-bit Adam, rank 0 of the job (its worker summary):")
for stage in ("warmup", "compression"):
    steps, sent = s[f"{stage}_steps"], s[f"bytes_sent_{stage}"]
    print(f"  {stage:<12} {steps:>5} steps x {sent / max(steps, 1) / 1e3:8.1f} kB sent per step")
w = s["bytes_sent_warmup"] / max(s["warmup_steps"], 1)
c = s["bytes_sent_compression"] / max(s["compression_steps"], 1)
if c:
    print(f"  compression stage: {w / c:.1f}x fewer bytes per step than the fp32 warmup")
PY
  cat "$RESULTS/onebit_summary.txt"
}

result_field() {
  "$PY" -c "import json,sys; print(sys.argv[3] % (float(sys.argv[4]) * json.load(open(sys.argv[1]))[sys.argv[2]]))" \
    "$1" "$2" "$3" "${4:-1}"
}

freeze_step() {
  "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['optimizer']['params']['freeze_step'])" "$OUT/job.json"
}

loss_plot() {
  local freeze
  freeze="$(freeze_step)"
  cat <<GP
set arrow 1 from $freeze, graph 0 to $freeze, graph 1 nohead dt 2 lc rgb "gray"
set label 1 "freeze_step" at $freeze, graph 0.04 offset 0.5,0 noenhanced
ema(x) = (s = (n == 0 ? x : $1 * s + $2 * x), n = n + 1, s)
n = 0; s = 0
plot "$OUT/onebit_adam/worker-0.csv" every ::1 using 1:(ema(\$4)) with lines lw 2 title "1-bit Adam (onebit)", \
     n = 0, "$OUT/adam.csv" every ::1 using 1:(ema(\$2)) with lines lw 2 title "Adam over DDP (gloo)"
GP
}
