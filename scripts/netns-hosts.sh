#!/usr/bin/env bash
# Makes "hosts" on one machine: network namespaces joined by veth pairs to a bridge (itself in
# a namespace of its own), each host with its own address, so that dtrain's host detection, the
# TCP path between hosts and the hierarchical collectives run for real. Needs root (iproute2).
#
#   scripts/netns-hosts.sh up NAME N SUBNET   hosts NAME-h0..NAME-h(N-1) at SUBNET.1..SUBNET.N
#   scripts/netns-hosts.sh down NAME N        removes them (and the bridge)
#   scripts/netns-hosts.sh cut NAME I         unplugs host I (its link goes down)
#   scripts/netns-hosts.sh run NAME I CMD...  runs CMD on host I
#
# Example: scripts/netns-hosts.sh up demo 2 10.77.1, then
#   scripts/netns-hosts.sh run demo 0 env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.77.1.1 ... &
#   scripts/netns-hosts.sh run demo 1 env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.77.1.1 ...
# Traffic stays inside these namespaces.
set -euo pipefail

cmd=${1:-}
name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || { sed -n '2,13p' "$0"; exit 2; }
switch="$name-sw"

case "$cmd" in
  up)
    n=$3 subnet=$4
    ip netns add "$switch"
    ip -n "$switch" link add br0 type bridge
    ip -n "$switch" link set br0 up
    for ((i = 0; i < n; i++)); do
      host="$name-h$i"
      ip netns add "$host"
      ip link add "$name-e$i" type veth peer name "$name-s$i"
      ip link set "$name-e$i" netns "$host"
      ip link set "$name-s$i" netns "$switch"
      ip -n "$host" link set lo up
      ip -n "$host" link set "$name-e$i" name eth0
      ip -n "$host" addr add "$subnet.$((i + 1))/24" dev eth0
      ip -n "$host" link set eth0 up
      ip -n "$switch" link set "$name-s$i" master br0
      ip -n "$switch" link set "$name-s$i" up
    done
    ;;
  down)
    n=$3
    for ((i = 0; i < n; i++)); do ip netns del "$name-h$i" 2>/dev/null || true; done
    ip netns del "$switch" 2>/dev/null || true
    ;;
  cut)
    ip -n "$switch" link set "$name-s$3" down
    ;;
  run)
    host="$name-h$3"
    shift 3
    exec ip netns exec "$host" "$@"
    ;;
  *)
    echo "netns-hosts: unknown command '$cmd'" >&2
    exit 2
    ;;
esac
