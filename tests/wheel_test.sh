#!/usr/bin/env bash
# The wheel as a new user installs it (docs/pytorch.md, "Train your own model"): a virtual
# environment that sees Debian's python3-torch, `pip install --no-index` of the wheel, the
# six commands on its PATH, and two jobs run from outside the repository with the
# installed copy: two processes with torchrun's variables (rank 0 embeds the coordinator),
# set by hand and by the installed onebit-run, and two under the installed onebit-launch.
set -euo pipefail
py=/usr/bin/python3
if ! "$py" -c "import torch, numpy, ensurepip" 2>/dev/null; then
  echo "SKIPPED: $py lacks torch, numpy or ensurepip (python3-torch, python3-numpy and" \
       "python3-venv come from deploy/install-deps.sh): the wheel was not installed"
  exit 0
fi
wheel=$(ls "${TEST_SRCDIR:?}"/onebit/python/onebit-*.whl)
cd "${TEST_TMPDIR:?}"
unset PYTHONPATH
export OMP_NUM_THREADS=1
"$py" -m venv --system-site-packages venv
venv/bin/python -m pip install -q --no-index --no-cache-dir "$wheel"
for c in onebit-coordinator onebit-server onebit-worker onebitctl onebit-launch onebit-run; do
  [ -x "venv/bin/$c" ] || { echo "FAIL: $c is not on the venv's PATH"; exit 1; }
done
venv/bin/python - <<'PY'
import onebit.torch as ot, onebit
assert "site-packages" in ot.__file__, ot.__file__   # the installed copy, not the repo's
from onebit import _onebit_core                       # the extension inside the package
print("import onebit.torch: OK from", ot.__file__)
PY

cat > job.json <<'JSON'
{"steps": 20, "seed": 1, "train_micro_batch_size_per_gpu": 1,
 "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 5}},
 "onebit": {"workers": 2, "log_every": 10, "workload": {"type": "pytorch", "parameters": 161},
            "failure": {"max_restarts": 0, "heartbeat_timeout_s": 5}}}
JSON
venv/bin/onebit-coordinator --check --config=job.json | grep -q "flags and config OK"

cat > train.py <<'PY'
import os
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
config = os.environ.get("ONEBIT_CONFIG") or {"steps": 20, "onebit": {"log_every": 10}}
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=5, config=config)
g = torch.Generator().manual_seed(ot.rank())
losses = []
while not opt.done:
    opt.zero_grad()
    x = torch.randn(64, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
    loss.backward()
    losses.append(loss.item())
    opt.step(loss=loss)
assert losses[-1] < losses[0], losses
print(f"rank {ot.rank()} of {ot.world_size()}: {len(losses)} steps, loss {losses[0]:.3f} -> "
      f"{losses[-1]:.3f}")
PY

# torchrun's variables (Debian's torchrun fails at start on the project's machines).
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    venv/bin/python train.py >"torchrun-$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  if ! wait "${pids[$r]}"; then echo "FAIL: rank $r"; cat "torchrun-$r.log"; exit 1; fi
  grep -q "rank $r of 2: 20 steps" "torchrun-$r.log" || { cat "torchrun-$r.log"; exit 1; }
done
echo "torchrun-style job: OK ($(grep -h 'rank 0 of 2' torchrun-0.log))"

# The same through the installed onebit-run (torchrun's variables, a free port trio).
venv/bin/onebit-run --nproc_per_node=2 --master_port=0 --log_dir=run train.py ||
  { cat run/rank-*.log; exit 1; }
grep -q "rank 1 of 2: 20 steps" run/rank-1.log || { cat run/rank-*.log; exit 1; }
echo "onebit-run from the wheel: OK"

# The installed onebit-launch (its binaries from the wheel) runs the same script.
venv/bin/onebit-launch --config=job.json --out_dir=launched --echo_all=false --timeout_s=120 \
  -- "$PWD/venv/bin/python" train.py >launch.log 2>&1 || { cat launch.log; exit 1; }
grep -q "rank 1 of 2: 20 steps" launched/*/worker-1.log || { cat launch.log launched/*/worker-1.log; exit 1; }
echo "onebit-launch from the wheel: OK"
