#!/usr/bin/env bash
# Start (or stop) a three-node Sluice cluster on this machine.
#
#   bash examples/cluster.sh start    # starts nodes 1..3, prints a psql line for each
#   bash examples/cluster.sh stop     # SIGTERM to every node (each hands leadership over)
#
# Environment:
#   SLUICE_BIN   the sluice binary            [target/release/sluice, else target/debug/sluice]
#   CLUSTER_DIR  data directories and logs    [./sluice-cluster]
#   BASE_PORT    node N serves Postgres clients on BASE_PORT+N and Raft peers on
#                BASE_PORT+100+N              [5500]
#
# Then, with psql, on any node:
#   CREATE STREAM orders (customer text, amount numeric(12,2));
#   INSERT INTO orders VALUES ('ann', 10.5);           -- any node: followers forward
#   SELECT * FROM orders;                              -- any node: its applied prefix
#   SET read_consistency = 'linearizable';             -- reads that wait for the leader
#   SELECT * FROM sluice_cluster;                      -- members, roles, indexes, lag
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${CLUSTER_DIR:-./sluice-cluster}
base=${BASE_PORT:-5500}
bin=${SLUICE_BIN:-}
if [ -z "$bin" ]; then
  for b in target/release/sluice target/debug/sluice; do [ -x "$b" ] && { bin=$b; break; }; done
fi
[ -x "${bin:-}" ] || { echo "no sluice binary: cargo build --release -p sluice-server, or set SLUICE_BIN" >&2; exit 2; }

peers="1=127.0.0.1:$((base + 101)),2=127.0.0.1:$((base + 102)),3=127.0.0.1:$((base + 103))"

case "${1:-}" in
  start)
    mkdir -p "$dir"
    for id in 1 2 3; do
      "$bin" serve --data-dir "$dir/node$id" --listen "127.0.0.1:$((base + id))" \
        --node-id "$id" --peers "$peers" > "$dir/node$id.log" 2>&1 &
      echo $! > "$dir/node$id.pid"
    done
    # A node serves clients once the cluster has a leader and it has caught up.
    for id in 1 2 3; do
      for _ in $(seq 1 300); do
        grep -q "listening on" "$dir/node$id.log" && break
        kill -0 "$(cat "$dir/node$id.pid")" 2>/dev/null || { echo "node $id exited; see $dir/node$id.log" >&2; exit 1; }
        sleep 0.1
      done
      grep -q "listening on" "$dir/node$id.log" || { echo "node $id did not start; see $dir/node$id.log" >&2; exit 1; }
      echo "node $id: psql \"host=127.0.0.1 port=$((base + id)) user=sluice\""
    done
    ;;
  stop)
    for id in 1 2 3; do
      f=$dir/node$id.pid
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$f"
    done
    ;;
  *)
    echo "usage: bash examples/cluster.sh start|stop" >&2; exit 2 ;;
esac
