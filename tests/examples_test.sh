#!/usr/bin/env bash
# The examples (examples/*) stay runnable: each trains a few steps with onebit.torch,
# launched torchrun-style through onebit-run (rank 0 embeds the coordinator), and with Adam
# over DDP, and both write their results. The full runs and their numbers are in examples/README.md.
set -euo pipefail
# One intra-op thread per PyTorch process: the jobs run several processes at once.
export OMP_NUM_THREADS=1
py=/usr/bin/python3
root="${TEST_SRCDIR:?}/onebit"
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch (Debian's python3-torch is not installed;" \
       "deploy/install-deps.sh installs it): the examples were not run"
  exit 0
fi
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIPPED: no /usr/share/datasets/fashion-mnist (dataset-fashion-mnist): the examples were not run"
  exit 0
fi
out="${TEST_TMPDIR:?}"
export PYTHONPATH="$root/python"
check() {  # a result JSON with a finite number under $2
  "$py" -c "import json, math, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; \
assert math.isfinite(v), v; print(sys.argv[1], sys.argv[2], v)" "$1" "$2"
}

# The examples' own helpers: example_job (a job config of fewer steps, freeze at half).
PY="$py"
# shellcheck source=../examples/run_lib.sh
source "$root/examples/run_lib.sh"
# torchrun-style, as the examples' run.sh launch them (onebit-run stands in for torchrun).
ranks() {  # N LOG_DIR [ONEBIT-RUN FLAGS] SCRIPT ARGS...: N ranks; on failure their logs
  local n=$1 logs=$2
  shift 2
  "$py" -m onebit.run --nproc_per_node="$n" --master_port=0 --log_dir="$logs" "$@" ||
    { cat "$logs"/rank-*.log; exit 1; }
}

ex="$root/examples/fashion_mnist_cnn"
mkdir -p "$out/cnn"
HERE="$ex" OUT="$out/cnn" example_job 30
ranks 4 "$out/cnn/logs" "$ex/train.py" --config="$out/cnn/job.json" \
  --result="$out/cnn/onebit.json" --print_every=10
"$py" "$ex/ddp_adam.py" --config="$out/cnn/job.json" --result="$out/cnn/adam.json" \
  --loss_csv="$out/cnn/adam.csv" --print_every=10
check "$out/cnn/onebit.json" test_accuracy
check "$out/cnn/adam.json" test_accuracy

# The same job restarted by its launcher: a checkpoint every 5 steps, every rank killed in
# step 18's exchange (ONEBIT_FAULT acts before the first restart only) and the group started
# again by onebit-run --max_restarts=1, as torchrun's would. The script resumes its loop at
# the job's step (opt.next_step), so the final model is the undisturbed run's: the same test
# loss and accuracy, to the last bit.
mkdir -p "$out/cnn-restarted"
"$py" - "$out/cnn/job.json" "$out/cnn-restarted" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
job["onebit"]["checkpoint"] = {"dir": sys.argv[2] + "/ckpt", "every_steps": 5}
job["onebit"]["failure"] = {"heartbeat_timeout_s": 2, "gloo_timeout_s": 10}
json.dump(job, open(sys.argv[2] + "/job.json", "w"), indent=1)
PY
ONEBIT_FAULT=kill_in_exchange:18 \
  ranks 4 "$out/cnn-restarted/logs" --max_restarts=1 "$ex/train.py" \
  --config="$out/cnn-restarted/job.json" --result="$out/cnn-restarted/onebit.json" \
  --print_every=10
grep -q "the job resumed after step 15" "$out/cnn-restarted/logs/rank-0.log" ||
  { echo "rank 0 did not resume after step 15"; cat "$out/cnn-restarted/logs"/rank-*.log; exit 1; }
"$py" - "$out/cnn/onebit.json" "$out/cnn-restarted/onebit.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for key in ("test_loss", "test_accuracy", "steps"):
    assert a[key] == b[key], (key, a[key], b[key])
print("restarted by the launcher: the undisturbed run's test loss", b["test_loss"])
PY

# Elastic: the job's 4 ranks all killed in step 18 with no restart left, then started
# again by 2 (torchrun --nnodes=MIN:MAX may come back with another world size; the config
# has no onebit.workers): resumed from step 15 with the error buffers reset, to the end.
mkdir -p "$out/cnn-elastic"
"$py" - "$out/cnn-restarted/job.json" "$out/cnn-elastic" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
del job["onebit"]["workers"]
job["onebit"]["checkpoint"]["dir"] = sys.argv[2] + "/ckpt"
json.dump(job, open(sys.argv[2] + "/job.json", "w"), indent=1)
PY
if ONEBIT_FAULT=kill_in_exchange:18 "$py" -m onebit.run --nproc_per_node=4 --master_port=0 \
    --log_dir="$out/cnn-elastic/four" "$ex/train.py" --config="$out/cnn-elastic/job.json" \
    --result="$out/cnn-elastic/four.json"; then
  echo "the 4 ranks were to be killed in step 18"; exit 1
fi
ranks 2 "$out/cnn-elastic/two" "$ex/train.py" --config="$out/cnn-elastic/job.json" \
  --result="$out/cnn-elastic/onebit.json" --print_every=10
grep -q "resuming from the checkpoint of step 15 (step-000000015); error buffers reset: the checkpoint's topology differs (workers 4 -> 2)" \
  "$out/cnn-elastic/two/rank-0.log" ||
  { echo "2 ranks did not resume the 4 ranks' job"; cat "$out/cnn-elastic/two"/rank-*.log; exit 1; }
check "$out/cnn-elastic/onebit.json" test_accuracy

ex="$root/examples/tiny_transformer_lm"
mkdir -p "$out/lm"
HERE="$ex" OUT="$out/lm" example_job 20
ranks 2 "$out/lm/logs" "$ex/train.py" --config="$out/lm/job.json" \
  --result="$out/lm/onebit.json" --held_out_csv="$out/lm/held_out.csv" --eval_every=10
"$py" "$ex/ddp_adam.py" --config="$out/lm/job.json" --result="$out/lm/adam.json" \
  --loss_csv="$out/lm/adam.csv" --held_out_csv="$out/lm/adam_held_out.csv" --eval_every=10
check "$out/lm/onebit.json" held_out_loss
check "$out/lm/adam.json" held_out_loss

# The GPT example, torchrun-style through onebit-run (rank 0 embeds the coordinator): a
# few steps of its tiny size with 1-bit Adam and with Adam over DDP.
ex="$root/examples/gpt"
if [ -f /usr/share/dictd/gcide.dict.dz ]; then
  for opt in onebit_adam ddp_adam; do
    "$py" -m onebit.run --nproc_per_node=2 --master_port=0 --log_dir="$out/gpt-$opt" \
      "$ex/train.py" --optimizer=$opt --size=tiny --steps=12 --freeze_step=6 \
      --limit_bytes=2000000 --log_every=6 --result="$out/gpt-$opt.json" ||
      { cat "$out/gpt-$opt"/rank-*.log; exit 1; }
    check "$out/gpt-$opt.json" held_out_loss
  done
  # fp16 loss scaling (the config's fp16 block, opt.scale(loss)): the CPU computes in fp32,
  # so with the power-of-two scale and no overflow the model ends bit for bit where the
  # unscaled run did (two workers: overlap on or off gives the same bits).
  "$py" -m onebit.run --nproc_per_node=2 --master_port=0 --log_dir="$out/gpt-fp16" \
    "$ex/train.py" --optimizer=onebit_adam --size=tiny --steps=12 --freeze_step=6 \
    --limit_bytes=2000000 --log_every=6 --amp=fp16 --result="$out/gpt-fp16.json" ||
    { cat "$out/gpt-fp16"/rank-*.log; exit 1; }
  "$py" -c "import json, sys; a, b = (json.load(open(p))['held_out_loss'] for p in sys.argv[1:]); \
assert a == b, (a, b); print('fp16 loss scaling: the held-out loss of the unscaled run,', a)" \
    "$out/gpt-fp16.json" "$out/gpt-onebit_adam.json"
  echo "examples: all three ran"
else
  echo "SKIPPED (the GPT example only): no /usr/share/dictd/gcide.dict.dz (dict-gcide;" \
       "deploy/install-deps.sh installs it)"
  echo "examples: two of three ran"
fi
