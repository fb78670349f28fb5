#!/usr/bin/env bash
# rounds.py on real jobs' traces: 2 workers on loopback, 4 warmup and 6 compression steps
# of the synthetic workload, every transport call traced; in peer mode, then in ps mode
# with 2 shards (every push and result traced).
set -euo pipefail
root="${TEST_SRCDIR:?}/onebit"
out="${TEST_TMPDIR:?}/job"
mkdir -p "$out"
cat > "$out/job.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 8, "steps": 10, "seed": 1,
  "optimizer": {"type": "OneBitAdam",
                "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1.0, "freeze_step": 4}},
  "onebit": {"workers": 2, "device": "cpu", "lease_steps": 10, "log_every": 1000,
             "workload": {"type": "synthetic", "parameters": 300000}}
}
JSON
if ! "$root/deploy/onebit-launch" --config="$out/job.json" --out_dir="$out" \
    --bin_dir="$root" --compare_adam=false --echo_all=false --timeout_s=120 \
    --transport_trace > "$out/launch.log" 2>&1; then
  cat "$out/launch.log"; exit 1
fi
run="$out/onebit_adam"
ls "$run"
python3 "$root/tools/bench/rounds.py" "$run" | tee "$out/rounds.txt"
python3 "$root/tools/bench/rounds.py" "$run" --markdown > "$out/rounds.md"
# Per stage: calls and rounds (medians), and a timeline naming the calls.
row() { awk -v s="$1" '$1 == s' "$out/rounds.txt"; }
compression=$(row compression)
warmup=$(row warmup)
[ -n "$compression" ] && [ -n "$warmup" ] || { echo "FAIL: a stage is missing"; exit 1; }
# Compression: an AllToAll and a direct AllGather (blocks of ~19 kB): 2 calls, 2 rounds.
read -r _ steps _ calls rounds _ <<< "$compression"
[ "$calls" = 2 ] && [ "$rounds" = 2 ] || { echo "FAIL: compression: $compression"; exit 1; }
[ "$steps" -ge 8 ] || { echo "FAIL: compression steps measured: $steps"; exit 1; }
# Warmup: the exact allreduce's shifts (SendRecv), W-1 = 1 per half for each segment.
read -r _ _ _ calls rounds _ <<< "$warmup"
[ "$calls" -ge 2 ] && [ "$rounds" -ge 2 ] || { echo "FAIL: warmup: $warmup"; exit 1; }
grep -q "AllToAll" "$out/rounds.txt" && grep -q "AllGather" "$out/rounds.txt" &&
  grep -qE "SendRecv to [01] from [01]" "$out/rounds.txt" || { echo "FAIL: timeline"; exit 1; }
grep -q '^| compression |' "$out/rounds.md" || { echo "FAIL: markdown"; cat "$out/rounds.md"; exit 1; }

# ps mode, 2 shards on this host, the warmup through them (so both pushes go at once): a
# push and a result per shard, the results a round after the pushes.
ps="${TEST_TMPDIR:?}/ps"
mkdir -p "$ps"
sed 's/"workers": 2,/"workers": 2, "exchange": {"mode": "ps", "servers": 2, "warmup_over": "shards"},/' "$out/job.json" > "$ps/job.json"
if ! "$root/deploy/onebit-launch" --config="$ps/job.json" --out_dir="$ps" \
    --bin_dir="$root" --compare_adam=false --echo_all=false --timeout_s=120 \
    --transport_trace > "$ps/launch.log" 2>&1; then
  cat "$ps/launch.log"; exit 1
fi
python3 "$root/tools/bench/rounds.py" "$ps/onebit_adam" | tee "$ps/rounds.txt"
for stage in warmup compression; do
  read -r _ _ _ calls rounds _ <<< "$(awk -v s=$stage '$1 == s' "$ps/rounds.txt")"
  [ "$calls" = 4 ] && [ "$rounds" = 2 ] || { echo "FAIL: ps $stage: $calls calls, $rounds rounds"; exit 1; }
done
grep -qE "Push to [01]," "$ps/rounds.txt" && grep -qE "Result from [01]," "$ps/rounds.txt" ||
  { echo "FAIL: ps timeline"; exit 1; }
echo PASS
