#!/usr/bin/env bash
# Makes a cluster of "hosts" on one machine: network namespaces joined by veth links to switches
# (bridges in a namespace of their own), each host with its own address, so that dtrain's host
# detection, the TCP path between hosts and the topology-aware collectives run for real. The links
# can be shaped like real networks: a rate (tc tbf, or netem), a delay and jitter (netem, where the
# kernel has it), and loss (netem, else nftables); hosts can sit in racks whose switches meet
# through a slower link. Needs root and iproute2 (nftables for loss without netem).
#
#   netns-hosts.sh up NAME N SUBNET [--profile P] [--racks R] [--rack-profile P] [--cc ALGO]
#        hosts NAME-h0..NAME-h(N-1) at SUBNET.1..SUBNET.N, in R racks of consecutive hosts; this
#        machine reaches them at SUBNET.254 (the "head", unshaped: stores and launchers live here);
#        /run/dtrain-netns/NAME.topology.json says which hosts share a rack (DTRAIN_TOPOLOGY).
#        The hosts' TCP congestion control is ALGO, default cubic (Linux's default; where it
#        cannot be had, this machine's, said so), whatever this machine uses: with a VM image's
#        bbr, a connection that had idled started again below the link's rate, which made
#        every collective that changes partners step by step slow (docs/scaling.md)
#   netns-hosts.sh down NAME               removes everything NAME made
#   netns-hosts.sh shape NAME I P          gives host I's link profile P (both directions)
#   netns-hosts.sh loss NAME I PERCENT     drops PERCENT of host I's packets, each way (0 = none)
#   netns-hosts.sh spike NAME I MS         drops every packet of host I for MS milliseconds: TCP
#                                          retransmits after it, a delay spike of MS or more
#   netns-hosts.sh cut NAME I              unplugs host I (its link goes down)
#   netns-hosts.sh run NAME I CMD...       runs CMD on host I
#   netns-hosts.sh job NAME CMD...         runs CMD on every host at once, {node} in it standing
#                                          for the host's number and {host0} for host 0's
#                                          address: the nodes of one job (dtrain run --nnodes N
#                                          --node-rank {node} --master-addr {host0} ...); exits
#                                          with the first host's failure, else 0
#   netns-hosts.sh rsh NAME ADDR CMD...    runs CMD on the host with address ADDR: OpenMPI's
#                                          remote shell (--mca plm_rsh_agent "netns-hosts.sh rsh NAME")
#   netns-hosts.sh check                   exit 0 where hosts can be made here, else 77 and why
#   netns-hosts.sh profiles                the named profiles
#
# A profile is a name (see `profiles`) or rate=R,delay=D,jitter=J,loss=PCT (tc units: 10gbit,
# 20us). Without the kernel's netem (sch_netem), delay and jitter cannot be added: `up` says so
# and the links keep the latency they have (measure it: dtrain bench allreduce --calibrate).
#
# Example: scripts/netns-hosts.sh up demo 2 10.77.1 --profile 10gbe, then
#   scripts/netns-hosts.sh run demo 0 env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.77.1.1 ... &
#   scripts/netns-hosts.sh run demo 1 env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.77.1.1 ...
# Traffic stays inside these namespaces (and the head's link).
set -euo pipefail

state_dir=/run/dtrain-netns

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }

# name -> rate delay jitter loss. Latencies are one-way, a kernel TCP stack's on such links.
profile_of() {
  case "$1" in
    none|"") echo "- - - -" ;;
    1gbe) echo "1gbit 50us 5us -" ;;
    10gbe) echo "10gbit 20us 2us -" ;;
    25gbe) echo "25gbit 10us 1us -" ;;
    rack-10gbe) echo "2500mbit 100us 10us -" ;;   # a 4:1 oversubscribed 10 GbE uplink
    rack-25gbe) echo "6250mbit 50us 5us -" ;;
    wan) echo "1gbit 1ms 100us -" ;;
    *=*)
      local rate=- delay=- jitter=- loss=- kv
      IFS=, read -ra kv <<<"$1"
      for item in "${kv[@]}"; do
        case "$item" in
          rate=*) rate=${item#rate=} ;;
          delay=*) delay=${item#delay=} ;;
          jitter=*) jitter=${item#jitter=} ;;
          loss=*) loss=${item#loss=} ;;
          *) echo "netns-hosts: profile item '$item' is not rate=, delay=, jitter= or loss=" >&2; return 2 ;;
        esac
      done
      echo "$rate $delay $jitter $loss" ;;
    *) echo "netns-hosts: no profile '$1' (netns-hosts.sh profiles lists them)" >&2; return 2 ;;
  esac
}

have_netem() {
  local ns="dtrain-netem-probe-$$" ok=1
  ip netns add "$ns" 2>/dev/null || return 1
  ip -n "$ns" link add p0 type veth peer name p1 2>/dev/null &&
    ip netns exec "$ns" tc qdisc add dev p0 root netem delay 1us 2>/dev/null && ok=0
  ip netns del "$ns" 2>/dev/null || true
  return $ok
}

# tbf's bucket: 250 us at the rate, and at least two 64 KiB GSO frames (a bigger bucket would let
# mid-sized messages pass at memory speed).
burst_of() {
  local rate=$1 bits
  case "$rate" in
    *gbit) bits=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bits=$(( ${rate%mbit} * 1000000 )) ;;
    *kbit) bits=$(( ${rate%kbit} * 1000 )) ;;
    *) bits=${rate%bit} ;;
  esac
  local b=$(( bits / 8 / 4000 ))
  (( b < 131072 )) && b=131072
  echo "$b"
}

# shape_dev NS DEV PROFILE: the egress of DEV in NS.
shape_dev() {
  local ns=$1 dev=$2 rate delay jitter loss
  read -r rate delay jitter loss < <(profile_of "$3")
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  if [ -z "$no_netem" ] && { [ "$delay" != - ] || [ "$jitter" != - ] || [ "$loss" != - ]; }; then
    local args=()
    if [ "$delay" != - ]; then
      args+=(delay "$delay")
      [ "$jitter" != - ] && args+=("$jitter")
    fi
    [ "$rate" != - ] && args+=(rate "$rate")
    [ "$loss" != - ] && args+=(loss "$loss%")
    ip netns exec "$ns" tc qdisc add dev "$dev" root netem "${args[@]}" limit 100000
  elif [ "$rate" != - ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$(burst_of "$rate")" latency 50ms
  fi
}

# set_loss NS PERCENT: nftables drops that share of packets in and out of NS (no netem needed).
set_loss() {
  local ns=$1 pct=$2
  ip netns exec "$ns" nft delete table inet dtrain_loss 2>/dev/null || true
  [ "$pct" = 0 ] || [ "$pct" = - ] && return 0
  command -v nft >/dev/null || { echo "netns-hosts: loss without netem needs nft (apt install nftables)" >&2; return 1; }
  local ppm
  ppm=$(awk -v p="$pct" 'BEGIN { printf "%d", p * 10000 }')
  ip netns exec "$ns" nft -f - <<EOF
table inet dtrain_loss {
  chain out { type filter hook output priority 0; numgen random mod 1000000 < $ppm drop; }
  chain in { type filter hook input priority 0; numgen random mod 1000000 < $ppm drop; }
}
EOF
}

# The profile's loss where netem cannot carry it.
apply_profile() {
  local host_ns=$1 host_dev=$2 sw_ns=$3 sw_dev=$4 profile=$5 rate delay jitter loss
  read -r rate delay jitter loss < <(profile_of "$profile")
  shape_dev "$host_ns" "$host_dev" "$profile"
  shape_dev "$sw_ns" "$sw_dev" "$profile"
  if [ -n "${no_netem:-}" ] && [ "$loss" != - ]; then set_loss "$host_ns" "$loss"; fi
}

load_state() {
  [ -f "$state_dir/$1" ] || { echo "netns-hosts: no hosts named '$1' are up" >&2; exit 2; }
  # shellcheck disable=SC1090
  . "$state_dir/$1"
}

no_netem=
cmd=${1:-}
case "$cmd" in
  ""|-h|--help) usage ;;
  profiles)
    for p in 1gbe 10gbe 25gbe rack-10gbe rack-25gbe wan; do
      read -r rate delay jitter loss < <(profile_of "$p")
      printf '%-11s rate %-9s one-way delay %-6s jitter %s\n' "$p" "$rate" "$delay" "$jitter"
    done
    exit 0 ;;
  check)
    if [ "$(id -u)" != 0 ]; then echo "netns-hosts: needs root to make network namespaces"; exit 77; fi
    command -v ip >/dev/null || { echo "netns-hosts: needs iproute2 (ip)"; exit 77; }
    probe="dtrain-probe-$$"
    if ! err=$(ip netns add "$probe" 2>&1); then echo "netns-hosts: cannot make a network namespace: $err"; exit 77; fi
    ip netns del "$probe"
    have_netem || echo "netns-hosts: this kernel has no netem: links get rates and loss, not delay or jitter"
    exit 0 ;;
esac

name=${2:-}
[ -n "$name" ] || usage
switch="$name-sw"
have_netem || no_netem=1

case "$cmd" in
  up)
    n=${3:?hosts}
    subnet=${4:?subnet}
    shift 4
    profile=none racks=1 rack_profile=none cc=cubic cc_asked=
    while [ $# -gt 0 ]; do
      case "$1" in
        --profile) profile=$2; shift 2 ;;
        --cc) cc=$2; cc_asked=1; shift 2 ;;
        --racks) racks=$2; shift 2 ;;
        --rack-profile) rack_profile=$2; shift 2 ;;
        *) echo "netns-hosts: unknown option '$1'" >&2; exit 2 ;;
      esac
    done
    profile_of "$profile" >/dev/null && profile_of "$rack_profile" >/dev/null
    (( racks >= 1 && racks <= n )) || { echo "netns-hosts: --racks must be 1..$n" >&2; exit 2; }
    if [ -n "$no_netem" ]; then
      for p in "$profile" "$rack_profile"; do
        read -r _ delay jitter _ < <(profile_of "$p")
        if [ "$delay" != - ] || [ "$jitter" != - ]; then
          echo "netns-hosts: this kernel has no netem (sch_netem): profile $p's delay/jitter is not applied, only its rate and loss" >&2
        fi
      done
    fi
    # A namespace may only pick what this machine allows (one list for every namespace), and a
    # VM image may allow only its own choice. Where cubic cannot be had, the hosts keep this
    # machine's and say so; a congestion control asked for by name must be there.
    cc_dir=/proc/sys/net/ipv4
    keep="the hosts keep this machine's $(cat "$cc_dir/tcp_congestion_control" 2>/dev/null)"
    if ! grep -qw -- "$cc" "$cc_dir/tcp_available_congestion_control" 2>/dev/null; then
      echo "netns-hosts: this kernel has no congestion control '$cc' (it has: $(cat "$cc_dir/tcp_available_congestion_control" 2>/dev/null))" >&2
      [ -z "$cc_asked" ] || exit 2
      echo "netns-hosts: $keep" >&2
      cc=
    elif ! grep -qw -- "$cc" "$cc_dir/tcp_allowed_congestion_control"; then
      echo "netns-hosts: allowing congestion control $cc on this machine (tcp_allowed_congestion_control) for the hosts" >&2
      if ! (echo "$(cat "$cc_dir/tcp_allowed_congestion_control") $cc" >"$cc_dir/tcp_allowed_congestion_control") 2>/dev/null; then
        echo "netns-hosts: cannot allow $cc here (tcp_allowed_congestion_control is read-only): $keep" >&2
        [ -z "$cc_asked" ] || exit 2
        cc=
      fi
    fi
    mkdir -p "$state_dir"
    printf 'n=%s\nsubnet=%s\nracks=%s\nprofile=%s\nrack_profile=%s\ncc=%s\n' \
      "$n" "$subnet" "$racks" "$profile" "$rack_profile" "$cc" >"$state_dir/$name"
    ip netns add "$switch"
    ip -n "$switch" link add core type bridge
    ip -n "$switch" link set core up
    for ((r = 0; r < racks; r++)); do
      ip -n "$switch" link add "br$r" type bridge
      ip -n "$switch" link set "br$r" up
      if (( racks > 1 )); then
        # The rack's uplink: a veth pair from its switch to the core, shaped both ways.
        ip -n "$switch" link add "up$r" type veth peer name "dn$r"
        ip -n "$switch" link set "up$r" master "br$r"
        ip -n "$switch" link set "dn$r" master core
        ip -n "$switch" link set "up$r" up
        ip -n "$switch" link set "dn$r" up
        shape_dev "$switch" "up$r" "$rack_profile"
        shape_dev "$switch" "dn$r" "$rack_profile"
      fi
    done
    for ((i = 0; i < n; i++)); do
      host="$name-h$i"
      rack=$(( i * racks / n ))
      ip netns add "$host"
      [ -z "$cc" ] || ip netns exec "$host" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
      ip link add "$name-e$i" type veth peer name "$name-s$i"
      ip link set "$name-e$i" netns "$host"
      ip link set "$name-s$i" netns "$switch"
      ip -n "$host" link set lo up
      ip -n "$host" link set "$name-e$i" name eth0
      ip -n "$host" addr add "$subnet.$((i + 1))/24" dev eth0
      ip -n "$host" link set eth0 up
      ip -n "$switch" link set "$name-s$i" master "br$rack"
      ip -n "$switch" link set "$name-s$i" up
      apply_profile "$host" eth0 "$switch" "$name-s$i" "$profile"
    done
    # Which hosts share a rack, as dtrain reads it (DTRAIN_TOPOLOGY).
    {
      printf '{"racks": {'
      for ((r = 0; r < racks; r++)); do
        (( r > 0 )) && printf ', '
        printf '"rack%d": [' "$r"
        first=1
        for ((i = 0; i < n; i++)); do
          (( i * racks / n == r )) || continue
          (( first )) || printf ', '
          printf '"%s.%d"' "$subnet" $((i + 1))
          first=0
        done
        printf ']'
      done
      printf '}}\n'
    } >"$state_dir/$name.topology.json"
    # The head: this machine on rack 0's switch, unshaped.
    ip link add "$name-hd" type veth peer name "$name-hs"
    ip link set "$name-hs" netns "$switch"
    ip -n "$switch" link set "$name-hs" master br0
    ip -n "$switch" link set "$name-hs" up
    ip addr add "$subnet.254/24" dev "$name-hd"
    ip link set "$name-hd" up
    ;;
  down)
    if [ -f "$state_dir/$name" ]; then . "$state_dir/$name"; else n=${3:-64}; fi
    for ((i = 0; i < n; i++)); do ip netns del "$name-h$i" 2>/dev/null || true; done
    ip link del "$name-hd" 2>/dev/null || true
    ip netns del "$switch" 2>/dev/null || true
    rm -f "$state_dir/$name" "$state_dir/$name.topology.json"
    ;;
  shape)
    load_state "$name"
    apply_profile "$name-h$3" eth0 "$switch" "$name-s$3" "$4"
    ;;
  loss)
    load_state "$name"
    if [ -z "$no_netem" ]; then
      # netem carries loss with the rest of the profile.
      read -r rate delay jitter _ < <(profile_of "$profile")
      p="loss=$4"
      [ "$rate" != - ] && p+=",rate=$rate"
      [ "$delay" != - ] && p+=",delay=$delay"
      [ "$jitter" != - ] && p+=",jitter=$jitter"
      apply_profile "$name-h$3" eth0 "$switch" "$name-s$3" "$p"
    else
      set_loss "$name-h$3" "$4"
    fi
    ;;
  spike)
    load_state "$name"
    command -v nft >/dev/null || { echo "netns-hosts: spike needs nft (apt install nftables)" >&2; exit 1; }
    ip netns exec "$name-h$3" nft -f - <<EOF
table inet dtrain_spike {
  chain out { type filter hook output priority -1; drop; }
  chain in { type filter hook input priority -1; drop; }
}
EOF
    sleep "$(awk -v ms="$4" 'BEGIN { printf "%.3f", ms / 1000 }')"
    ip netns exec "$name-h$3" nft delete table inet dtrain_spike
    ;;
  cut)
    ip -n "$switch" link set "$name-s$3" down
    ;;
  run)
    host="$name-h$3"
    shift 3
    exec ip netns exec "$host" "$@"
    ;;
  job)
    load_state "$name"
    shift 2
    pids=()
    for ((i = 0; i < n; i++)); do
      args=()
      for a in "$@"; do
        a=${a//\{node\}/$i}
        args+=("${a//\{host0\}/$subnet.1}")
      done
      ip netns exec "$name-h$i" "${args[@]}" &
      pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do
      wait "$p" || { s=$?; (( status != 0 )) || status=$s; }
    done
    exit "$status"
    ;;
  rsh)
    load_state "$name"
    addr=$3
    shift 3
    # OpenMPI passes options of ssh before the host (-x, -o ...): skip them.
    while [[ "$addr" == -* ]]; do addr=$1; shift; done
    i=$(( ${addr##*.} - 1 ))
    [ "${addr%.*}" = "$subnet" ] && (( i >= 0 && i < n )) ||
      { echo "netns-hosts: $addr is not a host of '$name' ($subnet.1..$subnet.$n)" >&2; exit 2; }
    exec ip netns exec "$name-h$i" sh -c "$*"
    ;;
  *)
    echo "netns-hosts: unknown command '$cmd' (try --help)" >&2
    exit 2
    ;;
esac
