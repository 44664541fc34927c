#!/usr/bin/env bash
# One command for the benchmark suite: builds release binaries, starts
# Sluice and a local PostgreSQL (synchronous_commit=on, append-only tables
# with a bigserial key and the same columns) on temporary directories, runs
# the same workloads against both in one run, measures the disk's own
# limits (fdatasync latency, sequential write, `cat` of the segment files),
# and writes bench/results/<stamp>.{jsonl,md}, two PNG plots, and a fresh
# bench/README.md (bench/README.head.md + the results).
#
# Most workloads are driven by sluice-bench (bench/src); single-row INSERTs
# are also driven by the standard client `pgbench` (-M prepared, three
# scripts: a literal 1000-character payload, repeat('x', 1000), and a
# random bigint parameter plus the literal), at 1/8/64/128 connections
# (1/64 with --quick), three alternating runs per point (one with --quick;
# Sluice, then PostgreSQL): issue 25's pgbench targets, and a check that
# sluice-bench's own client is not what limits PostgreSQL. That section
# needs PostgreSQL and pgbench, and is skipped without them.
#
# A CPU-contention point runs the literal script at 64 connections again
# with a busy loop taking one core, for both systems (issue 25).
#
# The wide-history point (issue 25, bench/wide_history.sh) loads rows of
# (customer, amount, ~1 KiB payload) with 20 psql `\copy` into Sluice and
# into a second PostgreSQL (shared_buffers = 2GB), then times COPY TO, a
# GROUP BY over the two small columns and an equality filter through psql
# (1M rows, about 1 GB; 200k with --quick).
#
# The compression point (issue 23) loads the same ~1 KiB event rows into a
# fresh Sluice once per `compression` setting (none, lz4, zstd) and reads
# them back (COPY TO, GROUP BY) beside the same rows in one PostgreSQL
# table; a point that fails is recorded with null figures and its error,
# and the run goes on.
#
#   bash bench/run.sh            # full run (≥ 1 GiB scan, 5 M-row aggregate)
#   bash bench/run.sh --quick    # smaller points, under 5 minutes after the build
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ $quick = 1 ]; then
  secs=2; lat_secs=4; scan_rows=262144; agg_rows=1000000; seq_bytes=$((256 << 20))
  comp_rows=131072; comp_timeout=240; wide_rows=200000
  sweep="1,4,16,64,128"; one_runs=3; one_secs=1
  pgb_conns="1 64"; pgb_runs=1; pgb_secs=2
else
  secs=5; lat_secs=10; scan_rows=1100000; agg_rows=5000000; seq_bytes=$((1 << 30))
  comp_rows=$scan_rows; comp_timeout=900; wide_rows=1000000
  sweep="1,2,4,8,16,32,64,128"; one_runs=5; one_secs=3
  pgb_conns="1 8 64 128"; pgb_runs=3; pgb_secs=6
fi
# Disk: the pgbench tables reach ~5 GB per system, each wide-history load
# ~1.2 GB, PostgreSQL's WAL more; a full run that runs out of space fails
# half-way (PostgreSQL PANICs), so it does not start without ~20 GB free
# where its data goes (the temporary directory). SLUICE_BENCH_MIN_FREE_GB
# overrides the figure.
need_gb=${SLUICE_BENCH_MIN_FREE_GB:-$([ $quick = 1 ] && echo 5 || echo 20)}
free_gb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "bench/run.sh: ${TMPDIR:-/tmp} has ${free_gb} GB free; a run needs ${need_gb} GB" \
    "(set SLUICE_BENCH_MIN_FREE_GB to change that)" >&2
  exit 1
fi
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p sluice-server -p sluice-bench >&2
sluice=$target/release/sluice
bench=$target/release/sluice-bench

# plotting: matplotlib in a venv beside the build
venv=$target/bench-pyenv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check matplotlib >&2

out=$root/bench/results
mkdir -p "$out"
stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
json=$out/$stamp.jsonl
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

# start_sluice [flags...]: starts a Sluice on a new data directory; sets
# $port, $sluice_dir and $sluice_pid. It runs in a session of its own
# (setsid), as PostgreSQL's postmaster does (pg_ctl starts it with setsid):
# with the kernel's autogroup scheduling each session shares the CPU as one
# group, so a server in the bench's session would share its group with the
# load generator and the CPU hog while PostgreSQL has its own. (PostgreSQL
# goes further: each backend calls setsid, so its 64 backends are 64 groups;
# report.py says so beside the machine.)
start_sluice() {
  sluice_dir=$work/sluice-$RANDOM
  setsid "$sluice" serve --data-dir "$sluice_dir" --listen 127.0.0.1:0 "$@" > "$sluice_dir.out" 2> "$sluice_dir.err" &
  sluice_pid=$!
  echo $sluice_pid > "$sluice_dir.pid"
  for _ in $(seq 1 100); do
    if grep -q "listening on" "$sluice_dir.out" 2>/dev/null; then
      port=$(grep -o "listening on .*" "$sluice_dir.out" | sed 's/.*://')
      # with --metrics-listen: the endpoint's address (printed before the port)
      metrics=$(grep -o "metrics on .*" "$sluice_dir.out" | sed 's/metrics on //' || true)
      return
    fi
    sleep 0.1
  done
  echo "sluice did not start" >&2; cat "$sluice_dir.err" >&2; exit 1
}

stop_sluice() {
  kill "$sluice_pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$sluice_pid" 2>/dev/null || break; sleep 0.1; done
  rm -rf "$sluice_dir"
}

pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
pgport=$((20000 + RANDOM % 20000))
pgdata=$work/pg/data
if [ -x "$pgbin/initdb" ]; then
  mkdir -p "$pgdata"; chown -R postgres "$work/pg"
  # PostgreSQL refuses to run as root: initdb and the server run as `postgres`
  su postgres -c "$pgbin/initdb -D $pgdata -A trust -U postgres" >/dev/null
  su postgres -c "$pgbin/pg_ctl -D $pgdata -l $work/pg/log -w -o '-p $pgport -k /tmp -c listen_addresses=127.0.0.1 -c synchronous_commit=on -c fsync=on -c max_connections=300 -c shared_buffers=256MB -c max_wal_size=4GB' start" >/dev/null
  pg="host=127.0.0.1 port=$pgport user=postgres dbname=postgres"
else
  echo "PostgreSQL not found: running Sluice only" >&2
  pg=""
fi

record() { grep '^JSON ' | sed 's/^JSON //' >> "$json"; }
# both <mode> [args...]: the same workload against Sluice ($port) and PostgreSQL
both() {
  local mode=$1; shift
  "$bench" "$mode" --url "host=127.0.0.1 port=$port user=sluice" --target sluice --label sluice "$@" | record
  if [ -n "$pg" ]; then
    "$bench" "$mode" --url "$pg" --target postgres --label postgres "$@" | record
  fi
}

printf '{"workload":"machine","date":"%s","cores":%s,"ram_gib":%s,"kernel":"%s","disk":"%s","quick":%s,"autogroup":%s}\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(nproc)" "$(free -g | awk '/Mem:/ {print $2}')" "$(uname -sr)" \
  "$(df -h "$work" | tail -1 | awk '{print $1}')" "$([ $quick = 1 ] && echo true || echo false)" \
  "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo null)" >> "$json"

echo "== disk: fdatasync latency and sequential write" >&2
"$bench" disk --dir "$work/disk" --count 2000 --seq-bytes "$seq_bytes" | record
# let the disk finish with the sequential write before anything is timed on it
sync; sleep 5

echo "== group commit with a slow log disk (each fsync +2 ms)" >&2
start_sluice --test-fsync-delay-ms 2
"$bench" sweep --url "host=127.0.0.1 port=$port user=sluice" --target sluice --size 256 --label fsync+2ms \
  --connections "1,8,64" --seconds "$secs" | record
stop_sluice

echo "== single-row INSERT sweep, append latency, tails" >&2
start_sluice --metrics-listen 127.0.0.1:0
both sweep --size 1024 --connections "$sweep" --seconds "$secs"
# one connection waits for its own fdatasync per row, so it follows the disk's
# fsync time, which drifts within minutes here: the two systems take turns and
# the median ratio of the pairs is the figure of record
for _ in $(seq 1 "$one_runs"); do
  "$bench" sweep --url "host=127.0.0.1 port=$port user=sluice" --target sluice --label one \
    --size 1024 --connections 1 --seconds "$one_secs" | record
  if [ -n "$pg" ]; then
    "$bench" sweep --url "$pg" --target postgres --label one \
      --size 1024 --connections 1 --seconds "$one_secs" | record
  fi
done
# append latency at a fixed rate: the disk's own floor (the ideal
# group-commit log on the same disk, no server), Sluice and PostgreSQL take
# turns, three rounds; report.py takes the median of each percentile. Sluice's
# runs also record its own log fsync, commit, request and checkpoint times
# meanwhile (its metrics endpoint): the disk's tail during the run, beside the
# appends' tail
for _ in 1 2 3; do
  "$bench" floor --dir "$work/disk" --size 1024 --rate 3000 --seconds "$lat_secs" | record
  "$bench" latency --url "host=127.0.0.1 port=$port user=sluice" --target sluice --label sluice \
    --metrics "$metrics" --size 1024 --connections 8 --rate 3000 --seconds "$lat_secs" | record
  if [ -n "$pg" ]; then
    "$bench" latency --url "$pg" --target postgres --label postgres \
      --size 1024 --connections 8 --rate 3000 --seconds "$lat_secs" | record
  fi
done
for tails in 1 4 16; do
  "$bench" tail-latency --url "host=127.0.0.1 port=$port user=sluice" --rate 3000 --seconds "$lat_secs" --tails $tails | record
done
"$bench" stalled-tail --url "host=127.0.0.1 port=$port user=sluice" --rows 100000 --connections 32 \
  --server-pid "$sluice_pid" | record
stop_sluice

echo "== pgbench: single-row INSERT with the standard client" >&2
# pgbench_run <target> <script> <connections> <run> <conninfo>: one pgbench
# run, appended to $json as one record; a failed run is recorded with
# "tps": null and the first line of pgbench's stderr, and the bench goes on
pgbench_run() {
  local target=$1 script=$2 conns=$3 k=$4 conninfo=$5
  local out=$work/pgbench.out err=$work/pgbench.err rc=0 tps=null lat=null failed=null error=""
  timeout $((pgb_secs + 120)) "$pgbench" -n -M prepared -j 2 -c "$conns" -T "$pgb_secs" \
    -f "$work/pgbench-$script.sql" "$conninfo" > "$out" 2> "$err" || rc=$?
  if [ $rc = 0 ]; then
    tps=$(jnum "$(awk '/^tps = .*without initial connection time/ { print $3; exit }' "$out")")
    lat=$(jnum "$(awk '/^latency average = / { print $4; exit }' "$out")")
    failed=$(jnum "$(awk '/^number of failed transactions: / { print $5; exit }' "$out")")
    if [ "$tps" = null ]; then error="no tps line in pgbench's output"; fi
  else
    error=$(grep -m1 . "$err" || true)
    [ -n "$error" ] || error="pgbench exited with status $rc"
  fi
  if [ -n "$error" ]; then
    tps=null
    echo "pgbench $script, -c $conns, $target run $k failed: $error" >&2
    error=",\"error\":\"$(jstr "$error")\""
  fi
  printf '{"workload":"pgbench","script":"%s","connections":%s,"target":"%s","run":%s,"tps":%s,"latency_ms":%s,"failed":%s%s}\n' \
    "$script" "$conns" "$target" "$k" "$tps" "$lat" "$failed" "$error" >> "$json"
}
# jnum <text>: the text if it is a plain decimal number, else null
jnum() { if [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; then echo "$1"; else echo null; fi; }
# jstr <text>: the text for inside a JSON string: no control characters, \ and " escaped
jstr() { printf '%s' "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g'; }

pgbench=$(command -v pgbench || true)
[ -n "$pgbench" ] || pgbench=$pgbin/pgbench
psql=$(command -v psql || true)
[ -n "$psql" ] || psql=$pgbin/psql
if [ -z "$pg" ]; then
  echo "PostgreSQL not found: pgbench section skipped" >&2
elif [ ! -x "$pgbench" ] || [ ! -x "$psql" ]; then
  echo "pgbench or psql not found: pgbench section skipped" >&2
else
  start_sluice
  sl="host=127.0.0.1 port=$port user=sluice dbname=sluice"
  "$psql" "$sl" -Xqc "CREATE STREAM pgb (n bigint, payload text)" \
    || echo "pgbench: CREATE STREAM pgb failed in Sluice; its runs will record the errors" >&2
  "$psql" "$pg" -Xqc "CREATE TABLE pgb (id bigserial PRIMARY KEY, ts timestamptz DEFAULT now(), n bigint, payload text)" \
    || echo "pgbench: CREATE TABLE pgb failed in PostgreSQL; its runs will record the errors" >&2
  x1000=$(head -c 1000 /dev/zero | tr '\0' x)
  printf "INSERT INTO pgb (payload) VALUES ('%s');\n" "$x1000" > "$work/pgbench-literal.sql"
  printf "INSERT INTO pgb (payload) VALUES (repeat('x', 1000));\n" > "$work/pgbench-expression.sql"
  printf '\\set n random(1, 1000000000)\nINSERT INTO pgb (n, payload) VALUES (:n, '"'%s'"');\n' "$x1000" \
    > "$work/pgbench-parameter.sql"
  for script in literal expression parameter; do
    for conns in $pgb_conns; do
      # the two systems take turns, as for the one-connection pairs above:
      # report.py pairs run k of Sluice with run k of PostgreSQL
      for k in $(seq 1 "$pgb_runs"); do
        pgbench_run sluice "$script" "$conns" "$k" "$sl"
        pgbench_run postgres "$script" "$conns" "$k" "$pg"
      done
    done
  done
  # CPU contention (issue 25, acceptance 5): the literal script at 64
  # connections again while a busy loop takes one core's worth of CPU, the
  # same for both systems; report.py compares the ratio with the quiet one.
  # The hog is a session of its own, as another service on the machine is
  cp "$work/pgbench-literal.sql" "$work/pgbench-literal+hog.sql"
  for k in $(seq 1 "$pgb_runs"); do
    setsid bash -c 'while :; do :; done' &
    hog=$!
    echo $hog > "$work/hog.pid"
    pgbench_run sluice literal+hog 64 "$k" "$sl"
    pgbench_run postgres literal+hog 64 "$k" "$pg"
    kill $hog; wait $hog 2>/dev/null || true
    rm -f "$work/hog.pid"
  done
  stop_sluice
fi

echo "== bulk ingest and message sizes" >&2
start_sluice --max-row-bytes $((4 << 20))
both ingest --size 1024 --method insert --connections 4 --batch 100 --seconds "$secs"
both ingest --size 1024 --method copy --connections 4 --batch 1000 --seconds "$secs"
for size in 256 1024 5120 1048576; do
  conns=16; [ $size -ge 1048576 ] && conns=4
  "$bench" sweep --url "host=127.0.0.1 port=$port user=sluice" --target sluice --label size --size $size \
    --connections $conns --seconds "$secs" | record
  [ -n "$pg" ] && "$bench" sweep --url "$pg" --target postgres --label size --size $size \
    --connections $conns --seconds "$secs" | record
done
stop_sluice

echo "== history: scan of $scan_rows rows of 1 KiB, aggregate over $agg_rows rows" >&2
start_sluice
both load --table hist --size 1024 --rows "$scan_rows"
both scan --table hist --runs 2
# the physical limit of the scan: the segment files, read warm like the scan
segs=$(find "$sluice_dir" -name '*.seg' | sort)
seg_bytes=$(cat $segs | wc -c)
t0=$(date +%s.%N); cat $segs > /dev/null; t1=$(date +%s.%N)
awk -v b="$seg_bytes" -v a="$t0" -v z="$t1" -v n="$(echo "$segs" | wc -l)" \
  'BEGIN { s = z - a; printf "{\"workload\":\"cat\",\"bytes\":%d,\"seconds\":%.4f,\"mib_per_sec\":%.1f,\"files\":%d}\n", b, s, b / 1048576 / s, n }' >> "$json"
both load --table orders --size 16 --rows "$agg_rows"
both aggregate --table orders --runs 3
stop_sluice

echo "== compression: $comp_rows event rows of ~1 KiB per setting (none, lz4, zstd)" >&2
# compression_point <target> <setting> <url> [args...]: one point of the
# compression workload, appended to $json. sluice-bench writes a failed
# phase into its record ("error", null figures); a run that records
# nothing (a crash, a bad flag, $comp_timeout) is recorded here with null
# figures and the error line of its stderr. Its output stays in
# $work/compression.out until the next point.
compression_point() {
  local target=$1 setting=$2 url=$3; shift 3
  local out=$work/compression.out err=$work/compression.err rc=0 error
  timeout "$comp_timeout" "$bench" compression --url "$url" --target "$target" --compression "$setting" \
    --rows "$comp_rows" --size 1024 --batch 1000 --connections 4 --runs 2 --aggregate-runs 3 "$@" \
    > "$out" 2> "$err" || rc=$?
  cat "$err" >&2
  if grep -q '^JSON ' "$out"; then
    record < "$out"
    return 0
  fi
  if [ $rc = 124 ]; then
    error="timed out after $comp_timeout s"
  else
    error=$(grep -m1 '^sluice-bench: ' "$err" || tail -n1 "$err")
    [ -n "$error" ] || error="sluice-bench exited with status $rc"
  fi
  echo "compression $setting, $target: $error" >&2
  printf '{"workload":"compression","target":"%s","setting":"%s","rows":%s,"error":"%s"}\n' \
    "$target" "$setting" "$comp_rows" "$(jstr "$error")" >> "$json"
}
pg_events=0  # 1 once PostgreSQL's events table holds the rows
for setting in none lz4 zstd; do
  # a fresh Sluice per setting: its segment files are this stream's only
  start_sluice
  compression_point sluice "$setting" "host=127.0.0.1 port=$port user=sluice" --table "events_$setting" || true
  # the physical limit, as for the history scan: `cat` of the (compressed) segment files, warm
  segs=$(find "$sluice_dir" -name '*.seg' | sort)
  if [ -n "$segs" ]; then
    seg_bytes=$(cat $segs | wc -c)
    t0=$(date +%s.%N); cat $segs > /dev/null; t1=$(date +%s.%N)
    awk -v c="$setting" -v b="$seg_bytes" -v a="$t0" -v z="$t1" -v n="$(echo "$segs" | wc -l)" \
      'BEGIN { s = z - a; if (s <= 0) s = 1e-6; printf "{\"workload\":\"compression_cat\",\"setting\":\"%s\",\"bytes\":%.0f,\"seconds\":%.4f,\"mib_per_sec\":%.1f,\"files\":%d}\n", c, b, s, b / 1048576 / s, n }' >> "$json"
  fi
  stop_sluice
  # PostgreSQL's COPY TO, the reference, read again beside each setting (loaded once)
  if [ -n "$pg" ]; then
    if [ $pg_events = 1 ]; then
      compression_point postgres "$setting" "$pg" --table events --skip-load || true
    else
      compression_point postgres "$setting" "$pg" --table events || true
      if grep -q '"loaded":true' "$work/compression.out"; then pg_events=1; fi
    fi
  fi
done

echo "== wide history: $wide_rows rows of ~1 KiB through psql (bench/wide_history.sh)" >&2
if [ -n "$pg" ] && [ -x "$psql" ]; then
  bash bench/wide_history.sh --rows "$wide_rows" --sluice "$sluice" --json "$json" \
    || echo "wide history point failed (status $?)" >&2
fi

"$venv/bin/python" bench/report.py "$json" $([ $quick = 1 ] && echo --quick) >&2
echo "results: ${json%.jsonl}.md, bench/README.md" >&2
