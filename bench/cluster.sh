#!/usr/bin/env bash
# Replicated appends: a local 3-node cluster (fsync on every node) next to a
# single node, same workloads, one run. Writes bench/results/<date>-cluster.{jsonl,md}.
#
#   bash bench/cluster.sh            # full points
#   bash bench/cluster.sh --quick    # shorter points
#
# Clients connect to node 1 (leader or follower: a follower forwards writes to
# the leader, as any client of a cluster may see).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=5; lat_secs=10
[ "${1:-}" = "--quick" ] && { secs=2; lat_secs=4; }
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p sluice-server -p sluice-bench >&2
sluice=$target/release/sluice
bench=$target/release/sluice-bench
out=$root/bench/results
mkdir -p "$out"
stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
json=$out/$stamp-cluster.jsonl
md=$out/$stamp-cluster.md
work=$(mktemp -d /tmp/sluice-bench-cluster.XXXXXX)
cleanup() {
  for f in "$work"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  sleep 1; rm -rf "$work"
}
trap cleanup EXIT

# three distinct free ports below the kernel's ephemeral range (a port released by bind(0) is
# what the next bind(0) likes to return: two nodes must not get the same one)
free_ports() {
  python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
got = []
while len(got) < 3:
    p = random.randrange(10000, low) if low > 12000 else 0
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        p = s.getsockname()[1]
        if p not in got:
            got.append(p)
    except OSError:
        pass
    finally:
        s.close()
print(*got)
PY
}

wait_port() { # file → Postgres port
  for _ in $(seq 1 300); do
    if grep -q "listening on" "$1" 2>/dev/null; then
      grep -o "listening on .*" "$1" | head -1 | sed 's/.*://'; return
    fi
    sleep 0.1
  done
  echo "sluice did not start: $1" >&2; exit 1
}

record() { grep '^JSON ' | sed 's/^JSON //' >> "$json"; }

# single node
# its own session, as PostgreSQL's postmaster (see start_sluice in bench/run.sh)
setsid "$sluice" serve --data-dir "$work/single" --listen 127.0.0.1:0 > "$work/single.out" 2> "$work/single.err" &
echo $! > "$work/single.pid"
single=$(wait_port "$work/single.out")

# three nodes
read -r p1 p2 p3 < <(free_ports)
peers="1=127.0.0.1:$p1,2=127.0.0.1:$p2,3=127.0.0.1:$p3"
for id in 1 2 3; do
  setsid "$sluice" serve --data-dir "$work/n$id" --listen 127.0.0.1:0 --node-id $id --peers "$peers" \
    > "$work/n$id.out" 2> "$work/n$id.err" &
  echo $! > "$work/n$id.pid"
done
node1=$(wait_port "$work/n1.out"); wait_port "$work/n2.out" >/dev/null; wait_port "$work/n3.out" >/dev/null

{
  echo "# Replicated appends: 3-node cluster vs single node ($stamp)"
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, $(uname -sr). All three nodes share this machine and its disk; every node fsyncs its Raft log."
  echo
  echo "## Single-row INSERT throughput, 1 KiB rows, 1 and 64 connections (closed loop)"
  echo
} > "$md"
"$bench" sweep --url "host=127.0.0.1 port=$single user=sluice" --target sluice --size 1024 --label single-node \
  --connections "1,64" --seconds "$secs" | tee -a "$md" | record
"$bench" sweep --url "host=127.0.0.1 port=$node1 user=sluice" --target sluice --size 1024 --label 3-node \
  --connections "1,64" --seconds "$secs" | tee -a "$md" | record
{
  echo
  echo "## Append latency, open loop 3,000 rows/s, 1 KiB, 8 connections (coordinated-omission corrected)"
  echo
} >> "$md"
"$bench" latency --url "host=127.0.0.1 port=$single user=sluice" --target sluice --size 1024 --label single-node \
  --connections 8 --rate 3000 --seconds "$lat_secs" | tee -a "$md" | record
"$bench" latency --url "host=127.0.0.1 port=$node1 user=sluice" --target sluice --size 1024 --label 3-node \
  --connections 8 --rate 3000 --seconds "$lat_secs" | tee -a "$md" | record
{
  echo
  echo "Roles during the run:"
  echo
  echo '```'
  psql "host=127.0.0.1 port=$node1 user=sluice" -c "SELECT node_id, role, is_self, commit_index, match_index, lag FROM sluice_cluster ORDER BY node_id" 2>&1 || true
  echo '```'
} >> "$md"
echo "results: $md and $json" >&2
