#!/usr/bin/env bash
# tools/gpu/bench_table.py on two small runs written here: the per-pass ratio where both
# runs have it (the one-pass one against a binary without it), the 0.85 mark at the full
# size only, the change column, and a clear error for a file that is not a benchmark's.
set -euo pipefail
py=/usr/bin/python3
table="${TEST_SRCDIR:?}/onebit/tools/gpu/bench_table.py"
cd "${TEST_TMPDIR:?}"
"$py" - <<'PYEOF'
import json
def run(rows):
    return {"context": {}, "benchmarks": [
        dict(name=n + "/manual_time", run_type="iteration", **fields) for n, fields in rows]}
json.dump(run([
    ("DeviceToDeviceCopy", {"vs_copy": 1.0, "GB/s": 4081.0}),
    ("ServerAggregate/W=8", {"vs_copy": 0.40, "vs_copy_passes": 0.75}),
    ("Decompress", {"vs_copy": 0.90}),
    ("SumSquares/n=262144", {"vs_copy": 0.27}),
]), open("after.json", "w"))
json.dump(run([
    ("DeviceToDeviceCopy", {"vs_copy": 1.0, "GB/s": 4040.0}),
    ("ServerAggregate/W=8", {"vs_copy": 0.20}),
    ("Decompress", {"vs_copy": 0.80}),
]), open("before.json", "w"))
PYEOF
"$py" "$table" after.json > alone.md
cat alone.md
grep -qx 'copy: 4.08 TB/s' alone.md
grep -qx '| ServerAggregate/W=8 | \*\*0.750\*\* |' alone.md   # per pass, under the target
grep -qx '| Decompress | 0.900 |' alone.md
grep -qx '| SumSquares/n=262144 | 0.270 |' alone.md          # small size: not marked
grep -qx 'below 0.85: ServerAggregate/W=8' alone.md

"$py" "$table" after.json before.json > both.md
cat both.md
grep -qx 'copy: 4.08 TB/s (the earlier binary.s run: 4.04 TB/s)' both.md
# The earlier binary had no per-pass figure: both compared one-pass.
grep -qx '| ServerAggregate/W=8 | \*\*0.200\*\* | \*\*0.400\*\* | +100.0% |' both.md
grep -qx '| Decompress | \*\*0.800\*\* | 0.900 | +12.5% |' both.md
grep -qx '| SumSquares/n=262144 | - | 0.270 | - |' both.md

echo '{"benchmarks": []}' > empty.json
if "$py" "$table" empty.json 2> err.txt; then echo "an empty run was accepted"; exit 1; fi
grep -q 'no kernel with a vs_copy counter' err.txt
echo 'not json' > bad.json
if "$py" "$table" bad.json 2> err.txt; then echo "a non-JSON file was accepted"; exit 1; fi
grep -q 'bad.json: not a benchmark JSON' err.txt
echo PASS
