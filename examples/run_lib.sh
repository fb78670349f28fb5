# What the examples' run.sh share (sourced; HERE, ROOT, PY, OUT and RESULTS set before).
#
#   example_job STEPS            OUT/job.json: HERE/job.json, with STEPS steps (freeze at
#                                half) when STEPS > 0; prints the job's worker count
#   launch_onebit ARGS...        HERE/train.py ARGS as torchrun launches it (onebit-run, its
#                                stand-in on one machine): rank 0 runs the job's coordinator;
#                                every rank's history CSV and summary in OUT/onebit_adam
#   onebit_summary               RESULTS/onebit_summary.txt: rank 0's bytes per stage

example_job() {
  "$PY" - "$HERE/job.json" "$OUT/job.json" "$1" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
if int(sys.argv[3]) > 0:
    job["steps"] = int(sys.argv[3])
    job["optimizer"]["params"]["freeze_step"] = int(sys.argv[3]) // 2
json.dump(job, open(sys.argv[2], "w"), indent=1)
print(job["onebit"]["workers"])
PY
}

launch_onebit() {
  local workers
  workers="$(example_job "$OVERRIDE")"
  # onebit's extension (the wheel's, when pip-installed, serves as well). The project
  # machines share a disk cache; a fresh machine builds without one.
  (cd "$ROOT" && { bazel build --disk_cache=/work/.bazel-disk-cache //python:libonebit_core.so \
    2>/dev/null || bazel build //python:libonebit_core.so; })
  rm -rf "$OUT/onebit_adam" && mkdir -p "$OUT/onebit_adam"
  PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" \
    ONEBIT_HISTORY_CSV="$OUT/onebit_adam/worker-{rank}.csv" \
    ONEBIT_SUMMARY_FILE="$OUT/onebit_adam/summary-{rank}.json" \
    "$PY" -m onebit.run --nproc_per_node="$workers" --master_port=0 \
    "$HERE/train.py" --config="$OUT/job.json" "$@" | tee "$OUT/onebit.log"
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
