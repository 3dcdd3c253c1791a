#!/usr/bin/env bash
# Runs a command against a two-node Ray cluster on this one machine: a head and a second node (its own raylet and
# object store), one CPU each, so runs fanned out with `--ray` land on both nodes (benchmarks/fanout.py).
#
# Everything runs in namespaces of its own (root needed): a network namespace with only loopback, because Ray hands
# its workers the machine's interface address even when told 127.0.0.1, so nothing can leave; and a PID namespace,
# because `ray stop --force` kills every Ray process it can see, other people's clusters included. When the command
# ends the cluster is stopped, and the namespace's end takes any process left with it.
#
# Usage (as root): benchmarks/ray_two_nodes.sh COMMAND [ARGS...]
#   The command sees RAY_ADDRESS=127.0.0.1:<port>, e.g.
#   benchmarks/ray_two_nodes.sh sh -c '.venv/bin/python benchmarks/learning.py --seeds 0-1 --ray "$RAY_ADDRESS"'
# RAY_BIN picks the `ray` program (default: the one beside the project's .venv python); RAY_PORT the head's port;
# RAY_NODE_ARGS more `ray start` arguments for both nodes (e.g. "--num-gpus 1": Ray's resources are only labels).
set -euo pipefail
if [ "$#" -eq 0 ]; then
  echo "usage: $0 COMMAND [ARGS...]  (run as root; the command sees RAY_ADDRESS)" >&2
  exit 2
fi
if [ -z "${RAY_TWO_NODES_INSIDE:-}" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "$0: needs root for its network and PID namespaces (unshare --net --pid); run it with sudo" >&2
    exit 2
  fi
  exec env RAY_TWO_NODES_INSIDE=1 unshare --net --pid --fork --mount-proc -- "$0" "$@"
fi

here=$(cd "$(dirname "$0")/.." && pwd)
ray=${RAY_BIN:-$here/.venv/bin/ray}
port=${RAY_PORT:-6390}
head_dir=$(mktemp -d /tmp/ray-head.XXXXXX)
node_dir=$(mktemp -d /tmp/ray-node.XXXXXX)
export RAY_USAGE_STATS_ENABLED=0
# No token authentication: only loopback exists in this namespace, so no one outside can reach the cluster; and a
# token left in ~/.ray by another cluster would otherwise switch it on for the head alone.
export RAY_AUTH_MODE=disabled
cleanup() {
  "$ray" stop --force >/dev/null 2>&1 || true
  rm -rf "$head_dir" "$node_dir"
}
trap cleanup EXIT

ip link set lo up
read -r -a extra <<< "${RAY_NODE_ARGS:-}"
"$ray" start --head --port "$port" --temp-dir "$head_dir" --num-cpus 1 --include-dashboard false "${extra[@]}" >/dev/null
"$ray" start --address "127.0.0.1:$port" --temp-dir "$node_dir" --num-cpus 1 "${extra[@]}" >/dev/null
export RAY_ADDRESS="127.0.0.1:$port"
"$@"
