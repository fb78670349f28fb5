#!/usr/bin/env bash
# The step-time predictor of docs/will-it-help.md: its byte counts against the exchanges'
# own counters; every recorded row within 25% or excused with a reason (--check_all), and
# its stored table current; and two runs it must reject: a stale table, DDP's step halved.
set -euo pipefail
root="${TEST_SRCDIR:?}/onebit"
model="$root/tools/will_it_help.py"

echo "== byte counts against the counters of BENCHMARKS.md (int8 and fp8 sections)"
/usr/bin/python3 - "$model" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
w = importlib.util.module_from_spec(spec)
spec.loader.exec_module(w)
# Peer mode, W = 4, N = 1,000,003: payload bytes sent per worker per step, measured.
measured = {"onebit": 187_530, "int8": 1_500_096, "fp8": 1_546_926}
for codec, sent in measured.items():
    got = w.compressed_bytes(1_000_003, 4, codec)
    assert got == sent, (codec, got, sent)
# 25M parameters, 4 nodes: the bench's 4,687,524 bytes a compressed step, 150 MB a warmup.
assert w.compressed_bytes(25_000_000, 4) == 4_687_524
assert w.ring_bytes(25_000_000, 4, 4) == 150_000_000
print("ok")
PY

echo "== every recorded row"
out="${TEST_TMPDIR:?}/check_all.txt"
status=0
/usr/bin/python3 "$model" --check_all --root "$root" >"$out" || status=$?
cat "$out"
if [ "$status" != 0 ]; then
  echo "FAIL: a row is over 25% without a reason in EXCUSED, or EXCUSED names no row" >&2
  exit 1
fi
# The test's data must reach every kind of source, or rows would drop out unseen.
for want in "results/gpt/cluster-2026-11-27/onebit_adam" "fmnist-allgather/results-after-1.md" \
            "results/bench/2026-11-27/wire-after-4" "ddp16/warmup" "whole run, timed"; do
  grep -qF "$want" "$out" || { echo "FAIL: nothing from $want in the report" >&2; exit 1; }
done

echo "== the stored table against another warmup share (must fail: the table is stale)"
if /usr/bin/python3 "$model" --check_all --root "$root" --warmup 0.2 >"$out"; then
  echo "FAIL: --check_all passed with a table that the model does not give" >&2
  exit 1
fi
grep -q "is not what the files and the model give" "$out"

bad="$TEST_TMPDIR/ddp-halved.csv"
/usr/bin/python3 - "$root/results/bench/2026-11-24/results.csv" "$bad" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    if r["system"] == "ddp":
        r["step_ms"] = str(float(r["step_ms"]) / 2)
w = csv.DictWriter(open(sys.argv[2], "w", newline=""), fieldnames=rows[0].keys())
w.writeheader()
w.writerows(rows)
PY
echo "== DDP's steps halved (must fail)"
if /usr/bin/python3 "$model" --check "$bad" --root "$root"; then
  echo "FAIL: the model passed a run whose DDP steps were halved" >&2
  exit 1
fi
echo "will_it_help_test: OK"
