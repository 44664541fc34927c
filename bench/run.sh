#!/usr/bin/env bash
# One command for the append benchmarks: builds release binaries, starts
# Sluice and a local PostgreSQL (synchronous_commit=on, append-only table
# with a bigserial key) on temporary directories, runs the same workloads
# against both in one run, and writes bench/results/<date>.{json,md}.
#
#   bash bench/run.sh            # full run
#   bash bench/run.sh --quick    # shorter points (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1
secs=5; lat_secs=10
[ $quick = 1 ] && { secs=2; lat_secs=4; }
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p sluice-server -p sluice-bench >&2
sluice=$target/release/sluice
bench=$target/release/sluice-bench
out=$root/bench/results
mkdir -p "$out"
stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
json=$out/$stamp.jsonl
md=$out/$stamp.md
work=$(mktemp -d /tmp/sluice-bench.XXXXXX)
chmod 755 "$work"
cleanup() {
  for f in "$work"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  if [ -n "${pgdata:-}" ] && [ -d "$pgdata" ]; then
    su postgres -c "$pgbin/pg_ctl -D $pgdata -m immediate stop" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

start_sluice() { # args: extra flags; prints port
  local dir=$work/sluice-$RANDOM
  "$sluice" serve --data-dir "$dir" --listen 127.0.0.1:0 "$@" > "$dir.out" 2> "$dir.err" &
  echo $! > "$dir.pid"
  cp "$dir.pid" "$work/last.pid.txt"
  for _ in $(seq 1 100); do
    if grep -q "listening on" "$dir.out" 2>/dev/null; then
      grep -o "listening on .*" "$dir.out" | sed 's/.*://'
      return
    fi
    sleep 0.1
  done
  echo "sluice did not start" >&2; cat "$dir.err" >&2; exit 1
}

stop_last() {
  local pid; pid=$(cat "$work/last.pid.txt")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
}

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
pgport=$((20000 + RANDOM % 20000))
pgdata=$work/pg/data
if [ -x "$pgbin/initdb" ]; then
  mkdir -p "$pgdata"; chown -R postgres "$work/pg"
  su postgres -c "$pgbin/initdb -D $pgdata -A trust -U postgres" >/dev/null
  su postgres -c "$pgbin/pg_ctl -D $pgdata -l $work/pg/log -w -o '-p $pgport -k /tmp -c listen_addresses=127.0.0.1 -c synchronous_commit=on -c fsync=on -c max_connections=300 -c shared_buffers=256MB' start" >/dev/null
  pg_url="host=127.0.0.1 port=$pgport user=postgres dbname=postgres"
else
  echo "PostgreSQL not found: running Sluice only" >&2
  pg_url=""
fi

record() { grep '^JSON ' | sed 's/^JSON //' >> "$json"; }
sweep="1,2,4,8,16,32,64,128"
[ $quick = 1 ] && sweep="1,4,16,64,128"

{
  echo "# Sluice vs PostgreSQL — append benchmarks ($stamp)"
  echo
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, $(uname -sr). Disk of $work: $(df -h "$work" | tail -1 | awk '{print $1}')."
  echo
  echo "## Group commit with a slow log disk (each fsync +2 ms), single-row INSERT, 256 B"
  echo
} > "$md"

port=$(start_sluice --test-fsync-delay-ms 2)
"$bench" sweep --url "host=127.0.0.1 port=$port user=sluice" --target sluice --size 256 --label fsync+2ms \
  --connections "1,8,64" --seconds "$secs" | tee -a "$md" | record
stop_last

{
  echo
  echo "## Single-row INSERT throughput by connections, 1 KiB rows (closed loop, acknowledged rows)"
  echo
} >> "$md"
port=$(start_sluice)
"$bench" sweep --url "host=127.0.0.1 port=$port user=sluice" --target sluice --size 1024 --label sluice \
  --connections "$sweep" --seconds "$secs" | tee -a "$md" | record
if [ -n "$pg_url" ]; then
  "$bench" sweep --url "$pg_url" --target postgres --size 1024 --label postgres \
    --connections "$sweep" --seconds "$secs" | tee -a "$md" | record
fi

{
  echo
  echo "## Append latency, open loop 3,000 rows/s, 1 KiB, 8 connections (coordinated-omission corrected)"
  echo
} >> "$md"
"$bench" latency --url "host=127.0.0.1 port=$port user=sluice" --target sluice --size 1024 --label sluice \
  --connections 8 --rate 3000 --seconds "$lat_secs" | tee -a "$md" | record
if [ -n "$pg_url" ]; then
  "$bench" latency --url "$pg_url" --target postgres --size 1024 --label postgres \
    --connections 8 --rate 3000 --seconds "$lat_secs" | tee -a "$md" | record
fi
{
  echo
  echo "## Tail latency: commit acknowledged → row received by a COPY tail, 1 KiB at 3,000 rows/s"
  echo
} >> "$md"
"$bench" tail-latency --url "host=127.0.0.1 port=$port user=sluice" --rate 3000 --seconds "$lat_secs" | tee -a "$md" | record
{
  echo
  echo "## A COPY tail that stops reading while 100,000 rows are appended (32 connections)"
  echo
} >> "$md"
"$bench" stalled-tail --url "host=127.0.0.1 port=$port user=sluice" --rows 100000 --connections 32 \
  --server-pid "$(cat "$work/last.pid.txt")" | tee -a "$md" | record
stop_last
echo >&2
echo "results: $md and $json" >&2
