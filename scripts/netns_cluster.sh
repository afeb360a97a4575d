#!/usr/bin/env bash
# netns_cluster.sh — a real N-node cluster on one Linux machine: each "node" is a network namespace with an
# address of its own on a bridge, the link out of every node rate-limited by a token-bucket filter (tc tbf), a
# hostfile and an rsh agent so `mpirun --hostfile` starts each node's daemon inside its namespace (shared memory
# inside a node, TCP between nodes, as on a cluster). Needs root, ip and tc (iproute2) and unshare (util-linux).
#   scripts/netns_cluster.sh up [--nodes 2] [--slots 2] [--rate 1gbit]  then: source <dir>/env; mpirun --hostfile ...
#   scripts/netns_cluster.sh status | down          (down removes everything up made; nothing to remove is fine)
# Options (the same for up, status and down, before or after the command): --name sl-cl (namespaces NAME-n0..,
#   bridge NAME-br, veths NAME-v0..; "sl-" and at most 7 more)   --dir DIR (default /tmp/NAME: hostfile, env, rsh)
#   --subnet 10.77.0 (the nodes are .1 .. .N, the bridge .254)   --nodes N (default 2)   --slots K (per node, default 2)
#   --rate R (tc's units: 1gbit, 100mbit; default 1gbit; "none": no limit)   --burst B (tbf bucket, default 256kb)
# Exit status: 0 done, 1 an error, 77 this machine cannot do it (not root, no namespaces, no ip/tc): the message
# says what is missing and how to fix it (the ctest netns.* reports 77 as skipped). docs/netns_cluster.md.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "netns_cluster: $*" >&2; exit 1; }
unavailable() { echo "netns_cluster: cannot make a cluster here: $*" >&2; exit 77; }

cmd=""
NAME=sl-cl DIR="" SUBNET=10.77.0 NODES=2 SLOTS=2 RATE=1gbit BURST=256kb
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --subnet) SUBNET="$2"; shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --slots) SLOTS="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --burst) BURST="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    up|down|status) [[ -z "$cmd" ]] || die "two commands: '$cmd' and '$1'"; cmd="$1"; shift ;;
    *) die "unknown option or command '$1' (scripts/netns_cluster.sh --help)" ;;
  esac
done
[[ -n "$cmd" ]] || { usage; exit 1; }
# The names are the only handle down has on what up made: keep them ours (sl-) and within IFNAMSIZ (15).
[[ "$NAME" =~ ^sl-[a-z0-9]{1,7}$ ]] || die "--name '$NAME': want sl- and 1-7 lower-case letters or digits (e.g. sl-cl)"
[[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet '$SUBNET': want the first three octets, e.g. 10.77.0"
[[ "$NODES" =~ ^[0-9]+$ && "$NODES" -ge 1 && "$NODES" -le 64 ]] || die "--nodes '$NODES': want 1..64"
[[ "$SLOTS" =~ ^[0-9]+$ && "$SLOTS" -ge 1 ]] || die "--slots '$SLOTS': want a positive count"
DIR="${DIR:-/tmp/$NAME}"
BR="$NAME-br"

# What this machine must offer; each missing piece is named with its fix. Exit 77 (skip) where it cannot.
preflight() {
  [[ "$(id -u)" -eq 0 ]] || unavailable "not root (namespaces, veths and tc need CAP_NET_ADMIN): run it with sudo, or as root"
  local t
  for t in ip tc unshare; do
    command -v "$t" >/dev/null 2>&1 ||
      unavailable "'$t' not found: apt-get install $([[ $t == unshare ]] && echo util-linux || echo iproute2) (scripts/install_deps.sh installs it)"
  done
  local probe="$NAME-probe$$"
  if ! ip netns add "$probe" 2>/tmp/netns_probe.$$; then
    local why; why="$(cat /tmp/netns_probe.$$)"; rm -f /tmp/netns_probe.$$
    unavailable "'ip netns add' failed ($why): a container needs --privileged (or CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  fi
  rm -f /tmp/netns_probe.$$
  ip netns delete "$probe"
}

ns_of() { echo "$NAME-n$1"; }

status() {
  local any=0 i ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NAME-n[0-9]*$" || true); do
    any=1
    i="${ns##*-n}"
    printf '%s  %s  %s\n' "$ns" "$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')" \
      "$(tc -n "$ns" qdisc show dev eth0 2>/dev/null | grep -o 'tbf.*rate [^ ]*' || echo 'no rate limit')"
  done
  ip link show "$BR" >/dev/null 2>&1 && { any=1; echo "bridge $BR  $(ip -4 -o addr show dev "$BR" | awk '{print $4}')"; }
  if [[ $any -eq 0 ]]; then
    echo "no cluster '$NAME' is up"
    return 3
  fi
  [[ -f "$DIR/hostfile" ]] && echo "hostfile $DIR/hostfile; environment: source $DIR/env"
  return 0
}

down() {
  local ns pids=()
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-(n[0-9]+|probe[0-9]+)$" || true); do
    # Processes left inside a node (a job that hung): a namespace is only freed when they are gone.
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    if [[ ${#pids[@]} -gt 0 ]]; then
      echo "netns_cluster: stopping processes still in $ns: ${pids[*]}" >&2
      kill "${pids[@]}" 2>/dev/null || true
      sleep 1
      mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
      [[ ${#pids[@]} -eq 0 ]] || kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    ip netns delete "$ns"   # removes its end of the veth, and with it the bridge's end
  done
  ip link show "$BR" >/dev/null 2>&1 && ip link delete "$BR"
  local v
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^$NAME-v[0-9]*$" || true); do
    ip link delete "$v" 2>/dev/null || true
  done
  rm -f "$DIR/hostfile" "$DIR/env" "$DIR/rsh"
  rmdir "$DIR" 2>/dev/null || true
  echo "netns_cluster: cluster '$NAME' is down"
}

up() {
  if ip link show "$BR" >/dev/null 2>&1 || ip netns list | grep -q "^$NAME-n"; then
    die "cluster '$NAME' is already up (scripts/netns_cluster.sh down --name $NAME first)"
  fi
  ip -4 -o addr show | grep -q " inet $SUBNET\." &&
    die "the subnet $SUBNET.0/24 is already in use on this machine: choose another with --subnet"
  # From here on, a failure removes what was made so far.
  trap 'echo "netns_cluster: up failed; removing what it made" >&2; down >/dev/null 2>&1 || true' ERR
  mkdir -p "$DIR"
  # The switch: a bridge in the host's namespace, with the address .254 for mpirun (the head node that starts
  # the daemons). The nodes get no default route and forwarding is not touched: their traffic stays on it.
  ip link add "$BR" type bridge
  ip addr add "$SUBNET.254/24" dev "$BR"
  ip link set "$BR" up
  local i ns hosts=""
  for ((i = 0; i < NODES; i++)); do
    ns="$(ns_of $i)"
    ip netns add "$ns"
    ip link add "$NAME-v$i" type veth peer name eth0 netns "$ns"
    ip link set "$NAME-v$i" master "$BR" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [[ "$RATE" != none ]]; then
      # The node's link: everything it sends leaves at RATE (a token bucket of BURST bytes, 50 ms of queue).
      # Its receive side is the other nodes' send side, so every direction between two nodes has RATE.
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst "$BURST" latency 50ms
      # The head's control traffic to the node, on the bridge's port, at the same rate.
      tc qdisc add dev "$NAME-v$i" root tbf rate "$RATE" burst "$BURST" latency 50ms
    fi
    hosts+="$SUBNET.$((i + 1)) slots=$SLOTS"$'\n'
  done
  printf '%s' "$hosts" >"$DIR/hostfile"
  # The rsh agent: mpirun calls it as `agent HOST COMMAND...` to start a daemon (orted) on HOST. It runs the
  # command inside HOST's namespace, with a UTS namespace of its own whose hostname is the namespace's name
  # (so every node reports a name of its own), through sh as ssh would.
  cat >"$DIR/rsh" <<EOF
#!/usr/bin/env bash
# rsh agent of the netns cluster '$NAME' (scripts/netns_cluster.sh): mpirun --mca plm_rsh_agent $DIR/rsh
while [[ "\${1:-}" == -* ]]; do shift; done   # ssh-style options mpirun may add
host="\$1"; shift
case "\$host" in
$(for ((i = 0; i < NODES; i++)); do echo "  $SUBNET.$((i + 1))|$(ns_of $i)) ns=$(ns_of $i) ;;"; done)
  *) echo "netns rsh: '\$host' is no node of cluster '$NAME' (hostfile $DIR/hostfile)" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$1"' "\$ns" "\$*"
EOF
  chmod +x "$DIR/rsh"
  # The environment that makes a plain `mpirun --hostfile $DIR/hostfile` use the cluster: the agent, the
  # daemons' and the ranks' TCP on the cluster's subnet only, no tree spawn (the head starts every daemon).
  # The nodes share this machine's cores, so a waiting rank must yield its core: Open MPI does that by itself
  # only when a node has more ranks than slots (measured: lab 07, tp 2 x pp 2 on 4 ranks of one node launched
  # through the agent, 2 cores: 1,176 tokens/s spinning, about 10,000 with `mpirun --oversubscribe`, which yields).
  cat >"$DIR/env" <<EOF
# source me: mpirun over the netns cluster '$NAME' (scripts/netns_cluster.sh)
export OMPI_MCA_plm_rsh_agent=$DIR/rsh
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_oob_tcp_if_include=$SUBNET.0/24
export OMPI_MCA_btl_tcp_if_include=$SUBNET.0/24
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SL_NETNS_HOSTFILE=$DIR/hostfile
EOF
  trap - ERR
  echo "netns_cluster: $NODES nodes up ($(ns_of 0)..$(ns_of $((NODES - 1))), $SUBNET.1-$NODES, $SLOTS slots each)," \
    "link out of each node: ${RATE}"
  echo "  source $DIR/env"
  echo "  mpirun --hostfile $DIR/hostfile --map-by ppr:1:node --bind-to none -x PATH -x LD_LIBRARY_PATH PROGRAM"
}

case "$cmd" in
  up) preflight; up ;;
  down) preflight; down ;;
  status) preflight; status ;;
esac
