#!/usr/bin/env bash
# The migration examples (examples/migrate/, docs/from-ddp.md, docs/from-deepspeed.md) stay
# true: each before/after script trains with 2 processes launched torchrun-style (onebit-run
# stands in for torchrun) and its whole-data loss falls at least 10-fold; the onebit scripts
# end within 2.5x of DDP's Adam on the same data; each after script differs from its before
# script in few lines; each page's diff block is the scripts' real diff (and the DeepSpeed
# page's config the real one); and the DeepSpeed keys the page says onebit refuses are
# refused, naming the key.
set -euo pipefail
# One intra-op thread per PyTorch process: the jobs run several processes at once.
export OMP_NUM_THREADS=1
py=/usr/bin/python3
root="${TEST_SRCDIR:?}/onebit"
ex="$root/examples/migrate"
out="${TEST_TMPDIR:?}"
fail() { echo "migrate_test: FAIL: $*" >&2; exit 1; }

# The most lines (removed plus added, `diff` of before and after) each move may change: the
# pages promise a small diff.
max_ddp_diff=8
max_deepspeed_diff=20

# 1. Each page's diff block is the real diff of the scripts (so the page cannot drift), and
#    the diff stays small. Needs no torch.
block() {  # LANGUAGE PAGE: the page's first ```LANGUAGE block
  awk -v open="\`\`\`$1" '$0 == open { on = 1; next } on && /^```$/ { exit } on { print }' "$2"
}
for move in ddp deepspeed; do
  page="$root/docs/from-$move.md"
  diff -u --label "examples/migrate/${move}_before.py" --label "examples/migrate/${move}_after.py" \
    "$ex/${move}_before.py" "$ex/${move}_after.py" > "$out/$move.diff" || true
  [ -s "$out/$move.diff" ] || fail "${move}_before.py and ${move}_after.py do not differ"
  block diff "$page" > "$out/$move.page.diff"
  if ! cmp -s "$out/$move.diff" "$out/$move.page.diff"; then
    echo "docs/from-$move.md's diff block is not the scripts' diff; the difference:" >&2
    diff -u --label page --label scripts "$out/$move.page.diff" "$out/$move.diff" >&2 || true
    fail "paste the scripts' diff into docs/from-$move.md (the command is on the page)"
  fi
  changed=$(tail -n +3 "$out/$move.diff" | grep -c '^[-+]' || true)  # past the 2 header lines
  max_var="max_${move}_diff"
  [ "$changed" -le "${!max_var}" ] ||
    fail "${move}_after.py changes $changed lines of ${move}_before.py, more than ${!max_var}"
  echo "migrate_test: ${move}: the page's diff is the scripts' ($changed lines changed, at most ${!max_var})"
done

# docs/from-deepspeed.md shows ds_config.json as it is.
block json "$root/docs/from-deepspeed.md" | cmp -s - "$ex/ds_config.json" ||
  fail "docs/from-deepspeed.md's json block is not examples/migrate/ds_config.json"

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIPPED: $py cannot import torch (Debian's python3-torch is not installed;" \
       "deploy/install-deps.sh installs it): the migration scripts were not run"
  exit 0
fi
export PYTHONPATH="$root/python"

# 2. Each script, 2 processes: exit 0, and its final loss (over the whole data set) at most a
#    tenth of the initial one. Prints the final loss.
run() {  # SCRIPT: its final loss on stdout
  local name=$1 logs="$out/$1" start=$SECONDS
  if ! "$py" -m onebit.run --nproc_per_node=2 --master_port=0 --log_dir="$logs" "$ex/$name.py" \
      > "$out/$name.launcher.log" 2>&1; then
    cat "$out/$name.launcher.log" "$logs"/rank-*.log >&2
    fail "$name.py failed"
  fi
  "$py" - "$logs/rank-0.log" "$name" "$((SECONDS - start))" <<'PY'
import re, sys
log, name, seconds = sys.argv[1:]
found = re.findall(r"^initial loss ([0-9.]+), final loss ([0-9.]+)$", open(log).read(), re.M)
if len(found) != 1:
    sys.exit(f"migrate_test: FAIL: {name}.py printed no 'initial loss A, final loss B' line "
             f"(rank 0's log: {log})")
initial, final = map(float, found[0])
print(f"migrate_test: {name}: loss {initial} -> {final} ({seconds} s)", file=sys.stderr)
if not final <= initial / 10:
    sys.exit(f"migrate_test: FAIL: {name}.py's loss fell from {initial} to {final} only, "
             "not 10-fold")
print(final)
PY
}
comparable() {  # NAME LOSS REFERENCE: LOSS within 2.5x of DDP's Adam
  "$py" -c "import sys; name, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); \
sys.exit(0 if a <= 2.5 * b else f'migrate_test: FAIL: {name}.py ended at loss {a}, more than ' \
         f'2.5x the {b} of DDP with torch.optim.Adam (ddp_before.py)')" "$@"
}
ddp=$(run ddp_before)
loss=$(run ddp_after)  # (an assignment, so that set -e stops the test where run fails)
comparable ddp_after "$loss" "$ddp"
loss=$(run deepspeed_after)
comparable deepspeed_after "$loss" "$ddp"

# DeepSpeed's own run, where DeepSpeed is installed (its 1-bit Adam needs 2 GPUs here).
if ! why=$("$py" -c "import deepspeed" 2>&1); then
  echo "SKIPPED (deepspeed_before.py only): $py cannot import deepspeed (${why##*$'\n'});" \
       "DeepSpeed is not one of onebit's dependencies"
elif [ "$("$py" -c "import torch; print(torch.cuda.device_count())")" -lt 2 ]; then
  echo "SKIPPED (deepspeed_before.py only): DeepSpeed's 1-bit Adam runs on GPUs, and fewer" \
       "than 2 are visible"
else
  loss=$(run deepspeed_before)
  comparable deepspeed_before "$loss" "$ddp"
fi

# 3. The keys docs/from-deepspeed.md says onebit refuses: ds_config.json with each added is a
#    ValueError naming it, when the optimizer is built (before any process joins a job).
ONEBIT_WORLD_SIZE=2 "$py" - "$ex/ds_config.json" <<'PY'
import copy, sys
import torch
import onebit.torch as ot

base = ot.load_config(sys.argv[1])
# The page's table, row by row: (the key the error names, where it goes, its value).
refused = [
    ("zero_optimization.stage", ["zero_optimization"], {"stage": 3}),
    ("optimizer.params.comm_backend_name", ["optimizer", "params", "comm_backend_name"], "nccl"),
    ("optimizer.params.max_grad_norm", ["optimizer", "params", "max_grad_norm"], 1.0),
    ("optimizer.params.amsgrad", ["optimizer", "params", "amsgrad"], True),
    ("amp", ["amp"], {"enabled": True}),
] + [(key, [key], {"enabled": True}) for key in (
    "compression_training", "sparse_attention", "progressive_layer_drop", "curriculum_learning",
    "data_efficiency", "eigenvalue", "elasticity")] + [
    ("scheduler.type", ["scheduler"], {"type": "LRRangeTest", "params": {}}),
    ("train_batch_size", ["train_batch_size"], 256),  # 2 processes: 128
    ("pipeline", ["pipeline"], {"stages": 2}),
]
for key, path, value in refused:
    config = copy.deepcopy(base)
    block = config
    for part in path[:-1]:
        block = block[part]
    block[path[-1]] = value
    try:
        ot.OneBitAdam(torch.nn.Linear(2, 1).parameters(), config=config)
    except ValueError as e:
        if key not in str(e):
            sys.exit(f"migrate_test: FAIL: {'.'.join(path)} = {value} was refused without "
                     f"naming {key}: {e}")
        print(f"migrate_test: refused, as the page says: {str(e)[:160]}")
        continue
    sys.exit(f"migrate_test: FAIL: ds_config.json with {'.'.join(path)} = {value} was "
             "accepted; docs/from-deepspeed.md says onebit refuses it")
PY
echo "migrate_test: OK"
