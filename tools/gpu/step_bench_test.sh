#!/usr/bin/env bash
# tools/gpu/step_bench.py on the CPU (the tiny model, two workers): it runs its AdamW
# baseline and a 1-bit Adam job, and writes every field its GPU runs are read for, with no
# PCIe bytes on a CPU.
set -euo pipefail
py=/usr/bin/python3
root="${TEST_SRCDIR:?}/onebit"
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch and numpy (Debian's python3-torch is not installed;" \
       "deploy/install-deps.sh installs it): step_bench.py was not tested"
  exit 0
fi
cd "${TEST_TMPDIR:?}"
export PYTHONPATH="$root/python" OMP_NUM_THREADS=1
# Two workers (gloo), launched torchrun-style: with one, the compression stage compresses
# nothing.
"$py" -m onebit.run --nproc_per_node=2 --master_port=0 --log_dir=logs \
  "$root/tools/gpu/step_bench.py" --model tiny --device cpu --amp none --steps 10 \
  --freeze_step 4 --adamw_steps 4 --label cpu_try --result result.json ||
  { tail -n 30 logs/rank-*.log; exit 1; }
cat logs/rank-0.log
"$py" - result.json <<'PYEOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
assert r["label"] == "cpu_try" and r["workers"] == 2 and r["parameters"] > 0, r
assert r["adamw"]["step_s"] > 0 and r["adamw"]["compute_s"] > 0, r["adamw"]
for stage, steps in (("warmup", 4), ("compression", 6)):
    s = r["onebit"][stage]
    assert s["steps"] == steps, (stage, s)
    assert set(s["worker_split_s"]) == {"compute", "compress", "exchange", "update", "device_copy"}, s
    assert s["optimizer_step_s"] > 0 and s["compute_s"] > 0, s
    assert s["pcie_bytes_to_host"] == 0 and s["pcie_bytes_from_host"] == 0, s  # no bus
assert r["onebit"]["compression"]["worker_split_s"]["compress"] > 0, r["onebit"]
assert math.isfinite(r["compression_work_over_adamw"]) and r["compression_work_over_adamw"] > 0, r
print("step_bench.py: every field, no PCIe bytes on the CPU")
PYEOF
