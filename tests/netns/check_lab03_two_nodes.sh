#!/usr/bin/env bash
# check_lab03_two_nodes.sh — ctest netns.lab03_two_nodes: lab 03 on 2 nodes x 1 rank of a real cluster on this
# machine (scripts/netns_cluster.sh: network namespaces, TCP between them over a 1 Gbit/s tbf link) trains bit
# for bit as on 2 ranks over shared memory: every step's loss, lr, gradient norm, the validation losses and the
# final sample text (the weights' fingerprint) compared as the exact JSON values (scripts/compare_runs.py's rule).
# The cross-node run must also have sent over MPI's tcp BTL (its own verbose output says so).
#   tests/netns/check_lab03_two_nodes.sh --build-dir build [--data data/kjv]
# Exit 0 equal, 1 different or failed, 77 skipped (not root, no namespaces: the reason is printed). The cluster
# is torn down on every path (trap); each step has a timeout. About 5 s on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="" DATA="$ROOT/data/kjv"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD="$(cd "$2" && pwd)"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    *) echo "unknown option '$1'" >&2; exit 1 ;;
  esac
done
[[ -n "$BUILD" ]] || { echo "--build-dir is required" >&2; exit 1; }
EXE="$BUILD/bin/reference/lab03_ddp"
[[ -x "$EXE" ]] || { echo "FAIL: $EXE not found (cmake --build $BUILD --target lab03_ddp_ref)" >&2; exit 1; }
[[ -d "$DATA" ]] || { echo "FAIL: no corpus at $DATA (scripts/prepare_corpus.sh --build-dir $BUILD)" >&2; exit 1; }

# A cluster of our own, apart from one an instructor may have up (sl-cl, 10.77.0): name and subnet from the pid.
NAME="sl-t$(($$ % 1000000))"
SUBNET="10.79.$(($$ % 250))"
CLUSTER=("$ROOT/scripts/netns_cluster.sh" --name "$NAME" --subnet "$SUBNET" --dir "/tmp/$NAME")
WORK="$(mktemp -d /tmp/sl-netns-test.XXXXXX)"
CHILD="" UP_TRIED=0
cleanup() {
  [[ -n "$CHILD" ]] && kill "$CHILD" 2>/dev/null   # a step still running (timeout passes TERM on to it)
  if [[ $UP_TRIED -eq 1 ]]; then
    timeout 30 "${CLUSTER[@]}" down >/dev/null 2>&1 || echo "WARNING: '${CLUSTER[*]} down' failed" >&2
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM   # ctest's timeout sends TERM: exit through the EXIT trap, which tears down
# Each step runs under a timeout, in the background, so that a TERM interrupts the wait at once (bash runs a
# trap only after a foreground command ends). The timeouts add up to less than ctest's TIMEOUT.
bounded() {
  local secs="$1"; shift
  timeout "$secs" "$@" &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  return $rc
}

UP_TRIED=1
rc=0
bounded 20 "${CLUSTER[@]}" up --nodes 2 --slots 1 --rate 1gbit || rc=$?
[[ $rc -eq 77 ]] && { UP_TRIED=0; echo "SKIPPED: no two-node cluster on this machine (the line above says why)"; exit 77; }
[[ $rc -eq 0 ]] || { echo "FAIL: netns_cluster.sh up exited $rc" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Short, deterministic: 1 thread per rank on both sides (BLAS's threads must not differ between the runs).
ARGS=(--data "$DATA" --model tiny --seq-len 16 --micro-batch 4 --steps 6 --val-every 3 --val-batches 2
      --sample-tokens 24 --threads 1 --mode overlap --quiet --log-dir "$WORK")
cd "$ROOT"
echo "== shared memory: mpirun -np 2 (one node)"
bounded 40 mpirun -np 2 --oversubscribe --bind-to none "$EXE" "${ARGS[@]}" --run-id shm >"$WORK/shm.out" 2>&1 ||
  { cat "$WORK/shm.out"; echo "FAIL: the shared-memory run failed" >&2; exit 1; }
echo "== two nodes: mpirun --hostfile (1 rank per node, TCP between them)"
# shellcheck source=/dev/null
source "/tmp/$NAME/env"   # the cluster's rsh agent and its subnet for mpirun (netns_cluster.sh writes it)
bounded 60 mpirun --hostfile "/tmp/$NAME/hostfile" --map-by ppr:1:node --bind-to none -x PATH -x OMP_NUM_THREADS \
  --mca btl_base_verbose 100 "$EXE" "${ARGS[@]}" --run-id nodes >"$WORK/nodes.out" 2>&1 ||
  { tail -50 "$WORK/nodes.out"; echo "FAIL: the two-node run failed" >&2; exit 1; }
grep -q "Using tcp btl for send to" "$WORK/nodes.out" ||
  { grep "bml" "$WORK/nodes.out" >&2; echo "FAIL: the two-node run did not send over TCP" >&2; exit 1; }
if grep -q "Using vader btl for send to" "$WORK/nodes.out"; then
  echo "FAIL: the two ranks shared memory: they were not on two nodes" >&2; exit 1
fi
grep "Using tcp btl" "$WORK/nodes.out" | sed 's/^/  /'

python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd() / "scripts"))
from compare_runs import compared, first_difference  # the bit-for-bit rule of refactors, reused
work = Path(sys.argv[1])
def logs(run):
    out = {}
    for f in sorted((work / "lab03" / run).glob("rank*.jsonl")):
        recs = [compared(json.loads(l)) for l in f.read_text().splitlines() if l.strip()]
        out[f.name] = [r for r in recs if r is not None]
    return out
a, b = logs("shm"), logs("nodes")
if len(a) != 2 or len(b) != 2:
    sys.exit(f"FAIL: expected 2 rank logs per run, got {len(a)} (shared memory) and {len(b)} (two nodes)")
diff = first_difference(a, b)
if diff:
    sys.exit("FAIL: the two-node run differs from the shared-memory run (before = shared memory): " + diff)
steps = [r for r in a["rank0.jsonl"] if r["type"] == "step"]
summ = [r for r in a["rank0.jsonl"] if r["type"] == "summary"][0]
print(f"equal: {len(steps)} steps, last loss {steps[-1]['loss']!r}, grad norm {steps[-1]['grad_norm']!r}, "
      f"val loss {summ.get('val_loss_end')!r}, sample {summ.get('sample')!r}, on both ranks of both runs")
PY
echo "PASS"
