#!/usr/bin/env bash
# An emulated cluster on this machine (root only): network namespaces as hosts, joined by
# veth links to one bridge, each node's link rate-limited with tc. Traffic between nodes
# crosses the shaped links; traffic inside a node stays in its namespace.
#
#   tools/emulated_cluster.sh up NODES [RATE]   # RATE for tc, e.g. 1gbit, 100mbit; none: no limit
#   tools/emulated_cluster.sh down
#   tools/emulated_cluster.sh bytes             # per node: bytes that left and entered it
#
# Hosts: onebit-ctl at 10.213.0.1 (coordinator and shards) and onebit-node<i> at
# 10.213.0.<10+i>. `up` prints the onebit-launch flags that place a job on them. Another
# cluster can live beside it: ONEBIT_CLUSTER=name (at most 8 characters) and
# ONEBIT_CLUSTER_SUBNET=10.x.y name its hosts and addresses (the tests use their own).
# ONEBIT_CLUSTER_CC=cubic (or bbr, reno: net.ipv4.tcp_available_congestion_control) asks
# for the hosts' TCP congestion control; a new namespace takes the machine's (bbr on the
# project's machines, where Linux's own default is cubic), and where a namespace may not
# change it (these machines) `up` fails unless the machine's is already that one.
set -euo pipefail

PREFIX=${ONEBIT_CLUSTER:-onebit}
SUBNET=${ONEBIT_CLUSTER_SUBNET:-10.213.0}
BRIDGE=${PREFIX}-br0

die() { echo "emulated_cluster: $*" >&2; exit 1; }
[ ${#PREFIX} -le 8 ] || die "ONEBIT_CLUSTER must be at most 8 characters (interface names)"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
command -v ip > /dev/null || die "needs iproute2 (ip, tc)"

host_up() {  # name address rate
  local ns=$1 addr=$2 rate=$3
  local outer="${PREFIX}v${ns#${PREFIX}-}"  # the bridge side of the host's link
  outer=${outer/node/}
  ip netns add "$ns"
  ip link add "$outer" type veth peer name eth0 netns "$ns"
  ip link set "$outer" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [ -n "${ONEBIT_CLUSTER_CC:-}" ] &&
     [ "$(ip netns exec "$ns" sysctl -n net.ipv4.tcp_congestion_control)" != "$ONEBIT_CLUSTER_CC" ]; then
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$ONEBIT_CLUSTER_CC" ||
      die "cannot set TCP congestion control $ONEBIT_CLUSTER_CC in a namespace here; a new" \
          "namespace takes the machine's: sysctl -w net.ipv4.tcp_congestion_control=$ONEBIT_CLUSTER_CC" \
          "before 'up' (and back after)"
  fi
  if [ "$rate" != none ]; then
    # Both directions: what leaves the host (its eth0) and what enters it (the bridge side).
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    tc qdisc add dev "$outer" root tbf rate "$rate" burst 256kb latency 50ms
  fi
}

cmd_down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^${PREFIX}-" || true); do
    ip netns del "$ns"
  done
  ip link del "$BRIDGE" 2> /dev/null || true
}

cmd_up() {
  local nodes=${1:?usage: up NODES [RATE]} rate=${2:-none}
  [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "NODES must be in [1, 200]"
  # The kernel's ARP table is one for every namespace: each of the nodes + 1 hosts learns
  # the others, and past gc_thresh3 entries (1024 by default: 32 nodes make 1056) new
  # entries fail ("neighbor table overflow"), packets wait for ARP, TCP backs off, and a
  # 1.2 MB exchange took 27 s. Raise the thresholds to what the cluster needs (never lower).
  local need=$(( (nodes + 1) * (nodes + 1) + 256 ))
  if [ "$(sysctl -n net.ipv4.neigh.default.gc_thresh3)" -lt "$need" ]; then
    sysctl -q -w net.ipv4.neigh.default.gc_thresh3="$need" net.ipv4.neigh.default.gc_thresh2="$need"
  fi
  cmd_down
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  host_up "${PREFIX}-ctl" "${SUBNET}.1" none
  local list=""
  for ((i = 0; i < nodes; ++i)); do
    host_up "${PREFIX}-node$i" "${SUBNET}.$((10 + i))" "$rate"
    list+="${list:+,}${PREFIX}-node$i@${SUBNET}.$((10 + i))"
  done
  echo "--cluster_control=${PREFIX}-ctl@${SUBNET}.1 --cluster_nodes=$list"
}

cmd_bytes() {  # node tx_bytes rx_bytes, as the node's own eth0 counts them
  for ns in $(ip netns list | awk '{print $1}' | grep "^${PREFIX}-node" | sort -V); do
    echo "$ns $(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes) \
$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes)"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  bytes) cmd_bytes ;;
  *) die "usage: $0 up NODES [RATE] | down | bytes" ;;
esac
