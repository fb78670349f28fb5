#!/usr/bin/env bash
# bazel test //tools/chaos:chaos_job_test: the short version of the chaos soak
# (RELIABILITY.md, "Chaos"). onebit-chaos runs a job undisturbed, then under a few random
# faults restarted as a supervisor would, and must end with every worker's parameters bit
# for bit the undisturbed run's:
#   1. a ps job (2 shards) on loopback: the coordinator killed, twice within seconds once;
#   2. a hierarchical job with sharded optimizer state (2 nodes of 2 workers) on loopback:
#      workers killed, each resuming its slice of the checkpoint;
#   3. a peer job on an emulated cluster of 2 network namespaces: links cut (set down, then
#      up) and kills. Needs root and `ip netns`; elsewhere this part skips and says so.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
R="${TEST_SRCDIR:-$HERE/../..}/${TEST_WORKSPACE:-onebit}"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
CHAOS="$R/tools/chaos/onebit-chaos"
failures=0
check() {  # WHAT CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
job() {  # DIR MODE SERVERS STEPS [MORE_EXCHANGE_KEYS]
  cat > "$1/job.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "steps": $4, "seed": 1,
 "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 100}},
 "onebit": {"workers": 4, "exchange": {"mode": "$2", "servers": $3${5:-}}, "lease_steps": 4,
            "log_every": 50, "workload": {"type": "synthetic", "parameters": 200000},
            "checkpoint": {"dir": "$1/ckpt", "every_steps": 10, "keep": 3},
            "failure": {"heartbeat_timeout_s": 2, "gloo_timeout_s": 10, "ps_step_deadline_s": 10,
                        "rejoin_timeout_s": 60, "coordinator_retry_s": 30, "max_restarts": 100}}}
JSON
}
done_faults() {  # FAULTS_CSV PATTERN: faults done (empty outcome) whose row matches
  grep -E "$2" "$1" | awk -F, '$7 == ""' | wc -l
}

# 1. ps on loopback, the coordinator among the victims. Long enough for the four faults
# (about 11 s) on an idle machine too: 900 steps once ran in 2.6 s, all its faults landed
# after the job's end, and the test no longer saw a second kill.
mkdir -p "$TMP/ps"
job "$TMP/ps" ps 2 4000
"$CHAOS" --bin_dir="$R" --config="$TMP/ps/job.json" --faults=4 --seed=5 --gap_s=1.5,3 \
  --coordinator_share=0.5 --coordinator_twice_share=0.5 --out_dir="$TMP/ps/out" \
  > "$TMP/ps/chaos.log" 2>&1
code=$?
grep -E "^\[chaos|^\|" "$TMP/ps/chaos.log"
check "ps: the disturbed job ends with the undisturbed job's parameters (exit $code)" [ "$code" -eq 0 ]
check "ps: the coordinator was killed" [ "$(done_faults "$TMP/ps/out/faults.csv" ',kill,coordinator,')" -ge 1 ]
# (seed 5: four kills of the coordinator, one of them within seconds of the one before)
check "ps: the coordinator was killed again within seconds" \
  [ "$(done_faults "$TMP/ps/out/faults.csv" ',kill,coordinator,0.0,1,')" -ge 1 ]
check "ps: the report says bit-identical" grep -q "bit-identical" "$TMP/ps/out/report.md"

# 2. Sharded state: 2 nodes of 2 workers on loopback, workers killed (mid-step, mid-
# checkpoint, wherever the schedule lands). 700 steps take about 10 s undisturbed on the
# 2-core development machine; the first kill comes after 2.7 s (seed 7), and each kill
# lengthens the job by its recovery.
mkdir -p "$TMP/shard"
job "$TMP/shard" hierarchical 0 700 ', "local_size": 2, "shard_state": true'
"$CHAOS" --bin_dir="$R" --config="$TMP/shard/job.json" --faults=3 --seed=7 --gap_s=1.5,3 \
  --coordinator_share=0 --out_dir="$TMP/shard/out" > "$TMP/shard/chaos.log" 2>&1
code=$?
grep -E "^\[chaos|^\|" "$TMP/shard/chaos.log"
check "sharded: the disturbed job ends with the undisturbed job's parameters (exit $code)" \
  [ "$code" -eq 0 ]
check "sharded: a worker was killed" [ "$(done_faults "$TMP/shard/out/faults.csv" ',kill,worker')" -ge 1 ]
check "sharded: the report says bit-identical" grep -q "bit-identical" "$TMP/shard/out/report.md"

# 3. Link cuts between namespaces.
if [ "$(id -u)" -ne 0 ] || ! ip netns list > /dev/null 2>&1; then
  echo "SKIPPED: link cuts need root and network namespaces (ip netns); the loopback parts ran"
else
  export ONEBIT_CLUSTER=obchaost ONEBIT_CLUSTER_SUBNET=10.216.0
  trap '"$R/tools/emulated_cluster.sh" down' EXIT
  flags=$("$R/tools/emulated_cluster.sh" up 2 1gbit)
  mkdir -p "$TMP/peer"
  job "$TMP/peer" peer 0 1500
  # shellcheck disable=SC2086
  "$CHAOS" --bin_dir="$R" --config="$TMP/peer/job.json" --faults=4 --seed=3 --gap_s=2,4 \
    --cut_s=2,4 --cut_share=0.6 --coordinator_share=0.2 $flags --out_dir="$TMP/peer/out" \
    > "$TMP/peer/chaos.log" 2>&1
  code=$?
  grep -E "^\[chaos|^\|" "$TMP/peer/chaos.log"
  check "peer on namespaces: the disturbed job ends with the undisturbed job's parameters (exit $code)" \
    [ "$code" -eq 0 ]
  check "peer on namespaces: a link was cut and healed" \
    [ "$(done_faults "$TMP/peer/out/faults.csv" ',cut,')" -ge 1 ]
  check "peer on namespaces: no link left down" grep -q "links left down | none" "$TMP/peer/out/report.md"
fi
if [ "$failures" -ne 0 ]; then
  for f in "$TMP"/*/chaos.log; do echo "== $f"; tail -40 "$f"; done
  exit 1
fi
