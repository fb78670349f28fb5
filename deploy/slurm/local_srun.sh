#!/usr/bin/env bash
# srun for one machine, for testing deploy/slurm/onebit.sbatch where there is no Slurm:
# runs --ntasks (-n) copies of the command here, each with the variables srun gives a task
# (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_NODEID,
# SLURM_STEP_NUM_TASKS), waits for all, and exits with the highest task exit code, as srun
# does. --nodes, --nodelist and other placement options are accepted and ignored (one
# node). SIGTERM is passed on to the tasks.
set -uo pipefail
ntasks=1
while [ $# -gt 0 ]; do
  case $1 in
    --ntasks=*) ntasks=${1#*=} ;;
    -n|--ntasks) ntasks=$2; shift ;;
    --nodes=*|--nodelist=*|--exclusive|--kill-on-bad-exit*|--overlap) ;;
    -N|-w|--nodes|--nodelist) shift ;;
    --) shift; break ;;
    -*) echo "local_srun: unsupported option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "local_srun: no command" >&2; exit 2; }
pids=()
trap 'kill -TERM "${pids[@]}" 2> /dev/null' TERM INT
for ((i = 0; i < ntasks; ++i)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=$ntasks SLURM_NTASKS_PER_NODE=$ntasks \
    SLURM_STEP_NUM_TASKS=$ntasks SLURM_NODEID=0 "$@" &
  pids+=($!)
done
highest=0
for pid in "${pids[@]}"; do
  while true; do
    wait "$pid"
    code=$?
    # A wait interrupted by the trapped signal returns > 128 while the task still runs.
    kill -0 "$pid" 2> /dev/null || break
  done
  [ "$code" -gt "$highest" ] && highest=$code
done
exit "$highest"
