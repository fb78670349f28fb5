#!/bin/bash
# Renders deploy/grafana/dashboards/onebit.json against a live job and screenshots it with
# headless Chromium: a preview renderer of the same JSON, because Grafana is not packaged in
# Debian 12 and cannot be downloaded here (see deploy/grafana/README.md).
#
#   tools/dashboard_preview/run.sh [OUT.png] [SECONDS]
#
# Starts a real job (tools/dashboard_preview/job.json: coordinator, 2 shards, 2 workers on
# Fashion-MNIST with automatic freezing and checkpoints; it runs until stopped) through
# onebit-launch, a real Prometheus scraping every process each second, this directory's
# page behind server.py; lets the job run SECONDS (default 150), screenshots the page while
# the job still runs, then stops the job. Needs: prometheus, chromium (apt-get install
# prometheus chromium), python3, curl.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out_png=${1:-$root/deploy/grafana/dashboard.png}
run_s=${2:-150}
work=$(mktemp -d /tmp/onebit-dashboard-preview.XXXXXX)
echo "working in $work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap "exit 1" INT TERM  # through the EXIT trap

for tool in prometheus chromium python3; do
  command -v $tool >/dev/null || { echo "missing $tool: apt-get install $tool" >&2; exit 1; }
done
bazel build --disk_cache=/work/.bazel-disk-cache //deploy:onebit-launch //coordinator:onebit-coordinator \
  //server:onebit-server //worker:onebit-worker
bin=$root/bazel-bin

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

sed "s|CHECKPOINT_DIR|$work/ckpt|" tools/dashboard_preview/job.json > "$work/job.json"
start=$(date +%s)
"$bin/deploy/onebit-launch" --config="$work/job.json" --out_dir="$work/job" --compare_adam=false \
  --bin_dir="$bin" --echo_all=false > "$work/launch.log" 2>&1 &
pids+=($!)

# The coordinator's addresses, then every member's /metrics as registered.
addr=$work/job/onebit_adam/coordinator.addr  # the launcher's directory for the 1-bit Adam run
for _ in $(seq 240); do [ -s "$addr" ] && break; sleep 0.5; done
rest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rest"])' "$addr")
coord_metrics=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metrics"])' "$addr")
targets=""
for _ in $(seq 120); do
  targets=$(curl -s "http://$rest/v1/members" | python3 -c '
import json, sys
m = json.load(sys.stdin).get("members", [])
print(" ".join(x["metricsAddress"] for x in m if x.get("metricsAddress")))' || true)
  [ "$(echo $targets | wc -w)" -ge 4 ] && break
  sleep 0.5
done
echo "scraping $coord_metrics $targets"
prom_port=$(free_port)
{
  echo "global: {scrape_interval: 1s, evaluation_interval: 1s}"
  echo "scrape_configs:"
  echo "  - job_name: onebit"
  echo "    static_configs:"
  echo "      - targets: ['$coord_metrics'$(for t in $targets; do printf ", '%s'" "$t"; done)]"
} > "$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom" \
  --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
pids+=($!)
page_port=$(free_port)
python3 tools/dashboard_preview/server.py --port "$page_port" \
  --prometheus "http://127.0.0.1:$prom_port" --dashboard deploy/grafana/dashboards/onebit.json &
pids+=($!)

echo "job running; the page is http://127.0.0.1:$page_port/ (waiting ${run_s}s)"
sleep "$run_s"
curl -s "http://$rest/v1/job"; echo
now=$(date +%s)
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1960 \
  --virtual-time-budget=20000 --screenshot="$out_png" \
  "http://127.0.0.1:$page_port/?from=$start&to=$now&rate_interval=10s" 2>"$work/chromium.log"
echo "wrote $out_png"
curl -s -X POST "http://$rest/v1/stop" -d '{}' >/dev/null || true
sleep 3
