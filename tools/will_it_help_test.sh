#!/usr/bin/env bash
# The step-time model of docs/will-it-help.md against the recorded runs it cites, and once
# against a run it must reject (DDP's step halved: the model then promises too much).
set -euo pipefail
root="${TEST_SRCDIR:?}/onebit"
model="$root/tools/will_it_help.py"
runs=(2026-11-24 2026-11-24/syn100m 2026-11-27/width/w4 2026-11-27/width/w8
      2026-11-27/width/w16 2026-11-27/cc-bbr 2026-11-27/ps-cubic-separate)
for r in "${runs[@]}"; do
  echo "== results/bench/$r"
  /usr/bin/python3 "$model" --check "$root/results/bench/$r/results.csv"
done

bad="${TEST_TMPDIR:?}/ddp-halved.csv"
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
if /usr/bin/python3 "$model" --check "$bad"; then
  echo "FAIL: the model passed a run whose DDP steps were halved" >&2
  exit 1
fi
echo "will_it_help_test: OK"
