#!/usr/bin/env bash
# bazel test //deploy:slurm_test: deploy/slurm/onebit.sbatch as sbatch would run it, on this
# machine: Slurm cannot run here, so its srun is local_srun.sh (the same commands, each
# task with the SLURM_* variables srun gives it) and the allocation is localhost. A real
# job of real processes (coordinator, 2 shards, 2 workers, gRPC and gloo on loopback) runs
# to its end; the script's refusals are checked too.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
R="${TEST_SRCDIR:-$HERE/../..}/${TEST_WORKSPACE:-onebit}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
BIN="$TMP/bin"
mkdir -p "$BIN"
for b in coordinator/onebit-coordinator server/onebit-server worker/onebit-worker; do
  ln -sf "$R/$b" "$BIN/$(basename "$b")"
done
export PATH="$BIN:$PATH" ONEBIT_SRUN="$R/deploy/slurm/local_srun.sh"
SBATCH="$R/deploy/slurm/onebit.sbatch"
failures=0
check() {  # WHAT CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
# Three free ports (gRPC, REST, metrics), as onebit-run --master_port=0 draws them: below the
# kernel's ephemeral range, where no outgoing connection takes one before the coordinator binds.
free_port() { PYTHONPATH="$R/python" python3 -c 'from onebit.run import free_port_run; print(free_port_run())'; }

cat > "$TMP/job.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 8, "steps": 40, "seed": 1,
 "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 10}},
 "onebit": {"workers": 2, "exchange": {"mode": "ps", "servers": 2}, "lease_steps": 5,
            "log_every": 10, "workload": {"type": "synthetic", "parameters": 5003},
            "failure": {"heartbeat_timeout_s": 5}}}
JSON

# Outside an allocation, or with a task count the config does not have: refused.
out=$(env -u SLURM_JOB_NODELIST bash "$SBATCH" "$TMP/job.json" 2>&1)
code=$?
check "outside an allocation: exit 2 ($code)" test "$code" = 2
check "outside an allocation: says so" grep -q "not inside a Slurm allocation" <<< "$out"
out=$(SLURM_JOB_NODELIST=localhost SLURM_NTASKS=3 bash "$SBATCH" "$TMP/job.json" 2>&1)
code=$?
check "3 tasks for 2 workers: exit 2 ($code)" test "$code" = 2
check "3 tasks for 2 workers: names both" grep -q "the allocation has 3 tasks, the config 2 workers" <<< "$out"
echo '{"onebit": {"workers": 0}}' > "$TMP/bad.json"
out=$(SLURM_JOB_NODELIST=localhost bash "$SBATCH" "$TMP/bad.json" 2>&1)
code=$?
check "a bad config: exit 2 ($code)" test "$code" = 2
check "a bad config: names the key" grep -q "onebit.workers" <<< "$out"

# The job itself: every member an srun step, ranks from SLURM_PROCID.
cd "$TMP"
start=$(date +%s)
SLURM_JOB_NODELIST=localhost SLURM_NTASKS=2 SLURM_JOB_ID=7 ONEBIT_PORT=$(free_port) \
  timeout 300 bash "$SBATCH" "$TMP/job.json" > "$TMP/job.log" 2>&1
code=$?
cat "$TMP/job.log"
check "the job: exit 0 ($code, $(($(date +%s) - start)) s)" test "$code" = 0
check "the job: its shape from the config" grep -q "job of 2 workers and 2 shards" "$TMP/job.log"
check "the job: both shards registered" test "$(grep -c 'server [01] registered' "$TMP/job.log")" = 2
check "the job: worker ranks 0 and 1 from SLURM_PROCID" \
  test "$(grep -cE 'worker rank [01] of 2' "$TMP/job.log")" = 2
check "the job: the coordinator saw it end" grep -q "job over: every worker reported its last step" "$TMP/job.log"
check "the job: nothing left running" test -z "$(jobs -p)"

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
