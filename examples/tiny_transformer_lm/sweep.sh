#!/bin/bash
# The freeze_step tutorial's runs (docs/tutorial.md): the character transformer trained with
# 1-bit Adam at several freeze steps, with the automatic freeze, and once without the update
# clip, against Adam over DDP on the same data, model, seed and steps.
#
#   examples/tiny_transformer_lm/sweep.sh              # every run (~5 minutes on 2 cores)
#   PLOT_ONLY=1 examples/tiny_transformer_lm/sweep.sh  # redraw the plot from out/sweep
#
# Writes results/tiny_transformer_lm/sweep/sweep.csv (run, freeze step, held-out loss) and
# the tutorial's figure, docs/img/freeze-sweep.png (the held-out loss against the step).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=/usr/bin/python3
RESULTS="$ROOT/results/tiny_transformer_lm/sweep"
mkdir -p "$RESULTS"

# shellcheck source=../run_lib.sh
source "$HERE/../run_lib.sh"

# run NAME KEY=VALUE...: one 1-bit Adam run, its job.json with the keys changed (dotted
# paths, JSON values), into out/sweep/NAME.
run() {
  local name="$1"; shift
  local out="$HERE/out/sweep/$name" workers rc=0
  rm -rf "$out" && mkdir -p "$out"
  workers="$(job_config "$HERE/job.json" "$out/job.json" "$@")"
  echo "== $name: $*"
  onebit_train "$out" "$workers" --config="$out/job.json" --eval_every=25 \
    --result="$out/result.json" --held_out_csv="$out/held_out.csv" > "$out/run.log" 2>&1 || rc=$?
  echo "   exit $rc; $(tail -n 1 "$out/run.log")"
}

if [ -z "${PLOT_ONLY:-}" ]; then
  build_onebit
  for f in 25 50 125 250; do
    run "freeze-$f" "optimizer.params.freeze_step=$f"
  done
  run "automatic" 'onebit.freeze={"mode": "automatic", "min_warmup": 25}'
  run "freeze-25-no-clip" "optimizer.params.freeze_step=25" "optimizer.params.update_clip=0"
  run "freeze-25-eps-1e-5-no-clip" "optimizer.params.freeze_step=25" \
    "optimizer.params.update_clip=0" "optimizer.params.eps=1e-5"
  out="$HERE/out/sweep/adam"; rm -rf "$out" && mkdir -p "$out"
  echo "== adam: Adam over DDP"
  "$PY" "$HERE/ddp_adam.py" --config="$HERE/job.json" --result="$out/result.json" \
    --loss_csv="$out/adam.csv" --held_out_csv="$out/held_out.csv" --eval_every=25 \
    > "$out/run.log" 2>&1
  echo "   $(tail -n 1 "$out/run.log")"
fi

# The table and the plot: each run's final held-out loss, and its curve against Adam's.
"$PY" - "$HERE/out/sweep" "$RESULTS" <<'PY'
import csv, json, os, sys
src, dst = sys.argv[1], sys.argv[2]
runs = ["adam", "freeze-25", "freeze-50", "freeze-125", "freeze-250", "automatic",
        "freeze-25-no-clip", "freeze-25-eps-1e-5-no-clip"]
rows = []
for r in runs:
    path = os.path.join(src, r, "result.json")
    if not os.path.exists(path):
        rows.append((r, "", "failed (see run.log)"))
        continue
    res = json.load(open(path))
    freeze = ""
    if r != "adam":  # the last warmup step in rank 0's history (the automatic freeze's too)
        with open(os.path.join(src, r, "worker-0.csv")) as f:
            freeze = max(int(row["step"]) for row in csv.DictReader(f)
                         if row["stage"] == "warmup")
    rows.append((r, freeze, "%.3f" % res["held_out_loss"]))
with open(os.path.join(dst, "sweep.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "freeze_step", "held_out_loss"])
    w.writerows(rows)
for r in rows:
    print("%-20s freeze %-6s held-out %s" % r)
PY
# curves RUN=TITLE...: gnuplot's plot clauses for those runs' held-out curves.
curves() {
  local out=() r f
  for spec in "$@"; do
    r="${spec%%=*}"; f="$HERE/out/sweep/$r/held_out.csv"
    [ -s "$f" ] && out+=("\"$f\" every ::1 using 1:2 with linespoints lw 2 pt 7 ps 0.5 title \"${spec#*=}\"")
  done
  (IFS=,; echo "${out[*]}")
}
gnuplot <<GP
set terminal pngcairo size 1400,560
set output "$ROOT/docs/img/freeze-sweep.png"
set datafile separator ","
set multiplot layout 1,2 title "char-level transformer, 2 workers, 500 steps: 1-bit Adam against Adam over DDP (held-out loss)"
set grid
set xlabel "step"
set ylabel "held-out loss (nats/char)"
set yrange [1.7:3.2]
set key top right
set title "the freeze step (eps 1e-8, update clip 2: the defaults)"
plot $(curves "adam=Adam over DDP" "freeze-25=freeze at 25" "freeze-50=freeze at 50" \
  "freeze-125=freeze at 125" "freeze-250=freeze at 250" "automatic=automatic freeze")
set title "eps and the update clip (freeze at 25)"
plot $(curves "adam=Adam over DDP" "freeze-25=eps 1e-8, clip 2 (the defaults)" \
  "freeze-25-no-clip=eps 1e-8, no clip" "freeze-25-eps-1e-5-no-clip=eps 1e-5, no clip")
unset multiplot
GP
echo "wrote $RESULTS/sweep.csv and docs/img/freeze-sweep.png"
