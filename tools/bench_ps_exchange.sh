#!/bin/bash
# ps mode's exchange against itself before/after and against peer mode's warmup ring, on
# loopback, alternating so that the shared machine's load falls on all of them alike:
#
#   tools/bench_ps_exchange.sh BEFORE_BIN AFTER_BIN [ROUNDS] [N] [ITERS]
#
# BEFORE_BIN/AFTER_BIN: directories with onebit-ps-exchange-bench (tools/) built from the
# two trees; peer mode is AFTER_BIN's onebit-allreduce-bench (ExactAllreduce "ring" and
# gloo's ring), 4 processes over gloo/TCP on 127.0.0.1. Prints one JSON line per run,
# with the load average before it.
set -euo pipefail
before=$1 after=$2 rounds=${3:-3} n=${4:-25000000} iters=${5:-5}
world=4
for ((r = 1; r <= rounds; ++r)); do
  for which in before after; do
    dir=$before; [[ $which == after ]] && dir=$after
    for stage in warmup compression; do
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      line=$("$dir/onebit-ps-exchange-bench" --workers=$world --shards=$world --n="$n" \
             --iters="$iters" --stage=$stage)
      echo "{\"round\": $r, \"tree\": \"$which\", \"load\": \"$load\", \"result\": $line}"
    done
  done
  store=$(mktemp -d)
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  for ((rank = 1; rank < world; ++rank)); do
    "$after/onebit-allreduce-bench" --rank=$rank --world=$world --store="$store" --n="$n" \
      --iters="$iters" --algos=ring,gloo_ring >/dev/null &
  done
  "$after/onebit-allreduce-bench" --rank=0 --world=$world --store="$store" --n="$n" \
    --iters="$iters" --algos=ring,gloo_ring | while read -r line; do
    echo "{\"round\": $r, \"tree\": \"peer\", \"load\": \"$load\", \"result\": $line}"
  done
  wait
  rm -rf "$store"
done
