#!/usr/bin/env bash
# The wide-history point of issue 25, measured as a user would: psql as the
# client, Sluice and a temporary PostgreSQL 15 side by side on this machine.
#
#   h (customer text, amount numeric(12,2), payload text), ~1 KiB payloads,
#   loaded with 20 `\copy` of rows/20 rows each (three alternating loads,
#   the last one kept); then, three runs each:
#   COPY (SELECT * FROM h) TO STDOUT, the GROUP BY customer aggregate, and
#   count(*) WHERE customer = 'c7'. Median seconds per system, the ratio
#   PostgreSQL / Sluice (> 1: Sluice is faster), Sluice's RSS after the load.
#   First, on the fresh servers, one bulk `\copy` of all the files and the
#   first again (~1.1 GB at 1M rows) into a table of its own, with Sluice's
#   peak RSS (VmHWM), and the same file with a bad row after 90% of it: the
#   COPY must fail and leave nothing visible.
#
# Usage (release build of the server first, e.g. by bench/run.sh, which runs
# this point too):
#   bash bench/wide_history.sh [--rows N] [--compression lz4|zstd|none] [--sluice PATH] [--json FILE]
# Defaults: 1,000,000 rows (about 1 GB), the stream's default compression,
# $CARGO_TARGET_DIR/release/sluice. Writes bench/results/wide-<stamp>.md, or
# with --json appends one `wide_history` record per workload to FILE instead.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
rows=1000000
compression=""
json=""
sluice=${CARGO_TARGET_DIR:-$root/target}/release/sluice
while [ $# -gt 0 ]; do
  case $1 in
    --rows) rows=$2; shift 2 ;;
    --compression) compression=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$sluice" ] || { echo "no server binary at $sluice" >&2; exit 2; }
chunks=20
per_chunk=$((rows / chunks))
rows=$((per_chunk * chunks))
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
psql=$(command -v psql || echo "$pgbin/psql")

work=$(mktemp -d /tmp/sluice-wide.XXXXXX)
chmod 755 "$work"
cleanup() {
  [ -n "${sluice_pid:-}" ] && kill "$sluice_pid" 2>/dev/null || true
  su postgres -c "$pgbin/pg_ctl -D $work/pg/data -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== generating $rows rows in $chunks CSV files" >&2
python3 - "$work" "$chunks" "$per_chunk" <<'PY'
import os, random, sys
work, chunks, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(25)
# event bodies: JSON-ish text of words from a small vocabulary with a unique id, so lz4
# finds what it finds in real events (about 2x), not 1 KiB of one repeated string
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(3, 10)))
         for _ in range(400)]
pool = []
for _ in range(20000):
    text = " ".join(rng.choice(words) for _ in range(200))
    pool.append(text)
n = 0
for c in range(chunks):
    with open(os.path.join(work, f"h{c:02}.csv"), "w") as f:
        for _ in range(per):
            body = '{"event":"order","n":%d,"id":"%032x","note":"%s"}' % (
                n, rng.getrandbits(128), rng.choice(pool))
            f.write('c%d,%d.%02d,"%s"\n' % (n % 100, rng.randrange(100000), n % 100, body[:1024].replace('"', '""')))
            n += 1
PY
chown -R postgres "$work"

mkdir -p "$work/pg/data"; chown -R postgres "$work/pg"
pgport=$((20000 + RANDOM % 20000))
su postgres -c "$pgbin/initdb -D $work/pg/data -A trust -U postgres" >/dev/null
su postgres -c "$pgbin/pg_ctl -D $work/pg/data -l $work/pg/log -w -o '-p $pgport -k /tmp -c listen_addresses=127.0.0.1 -c shared_buffers=2GB -c max_wal_size=8GB' start" >/dev/null
pg="host=127.0.0.1 port=$pgport user=postgres dbname=postgres"

# its own session, as PostgreSQL's postmaster (see start_sluice in bench/run.sh)
setsid "$sluice" serve --data-dir "$work/sluice" --listen 127.0.0.1:0 > "$work/sluice.out" 2> "$work/sluice.err" &
sluice_pid=$!
for _ in $(seq 1 100); do grep -q "listening on" "$work/sluice.out" 2>/dev/null && break; sleep 0.1; done
port=$(grep -o "listening on .*" "$work/sluice.out" | sed 's/.*://')
sl="host=127.0.0.1 port=$port user=sluice dbname=sluice"

with=""
[ -n "$compression" ] && with=" WITH (compression = '$compression')"
"$psql" "$sl" -Xqc "CREATE STREAM h (customer text, amount numeric(12,2), payload text)$with"
"$psql" "$pg" -Xqc "CREATE TABLE h (id bigserial, ts timestamptz DEFAULT now(), customer text, amount numeric(12,2), payload text)"

now() { date +%s.%N; }
echo "== bulk file: every file and the first again, one with a bad row at 90%" >&2
cat "$work"/h*.csv "$work"/h00.csv > "$work/bulk.csv"
bulk_rows=$((rows + per_chunk))
bulk_bytes=$(stat -c %s "$work/bulk.csv")
bad_at=$((bulk_rows * 9 / 10))
{ head -n "$bad_at" "$work/bulk.csv"; echo 'c1,not a number,"bad row"'; tail -n +$((bad_at + 1)) "$work/bulk.csv"; } > "$work/bulk-bad.csv"
chown postgres "$work"/bulk*.csv
declare -A bulk bulk_runs
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
create_bulk() { # <system> <table>
  if [ "$1" = sluice ]; then
    "$psql" "$sl" -Xqc "CREATE STREAM $2 (customer text, amount numeric(12,2), payload text)$with"
  else
    "$psql" "$pg" -Xqc "CREATE TABLE $2 (id bigserial, ts timestamptz DEFAULT now(), customer text, amount numeric(12,2), payload text)"
  fi
}
# three runs each, the systems taking turns, each into a fresh stream/table (the median
# is reported); then the copy with a bad row, once each
for k in 1 2 3; do
  for system in sluice postgres; do
    url=$sl; [ $system = postgres ] && url=$pg
    create_bulk $system bulk
    echo "== $system: one \\copy of $bulk_bytes bytes (run $k)" >&2
    # each system starts with no dirty pages of the files written before it (the CSV
    # files, the other system's data): their writeback would compete with its own writes
    sync
    t0=$(now)
    "$psql" "$url" -Xqc "\\copy bulk (customer, amount, payload) FROM '$work/bulk.csv' WITH (FORMAT csv)"
    t1=$(now)
    bulk_runs[$system]+=" $(echo "$t1 - $t0" | bc -l)"
    got=$("$psql" "$url" -XAtc "SELECT count(*) FROM bulk")
    [ "$got" = "$bulk_rows" ] || { echo "$system: bulk copy has $got rows, expected $bulk_rows" >&2; exit 1; }
    kind=TABLE; [ $system = sluice ] && kind=STREAM
    "$psql" "$url" -Xqc "DROP $kind bulk"
  done
done
# the peak of every run: each held at most what one did
bulk_hwm_kib=$(awk '/VmHWM/ { print $2 }' /proc/$sluice_pid/status)
for system in sluice postgres; do
  url=$sl; [ $system = postgres ] && url=$pg
  bulk[$system]=$(median ${bulk_runs[$system]})
  create_bulk $system bulk_bad
  if "$psql" "$url" -Xqc "\\copy bulk_bad (customer, amount, payload) FROM '$work/bulk-bad.csv' WITH (FORMAT csv)" 2> "$work/bad.err"; then
    echo "$system: the COPY with a bad row succeeded" >&2; exit 1
  fi
  left=$("$psql" "$url" -XAtc "SELECT count(*) FROM bulk_bad")
  [ "$left" = 0 ] || { echo "$system: a failed COPY left $left rows" >&2; exit 1; }
  kind=TABLE; [ $system = sluice ] && kind=STREAM
  "$psql" "$url" -Xqc "DROP $kind bulk_bad"
done

# timed <url> <psql args...>: seconds taken, output discarded
timed() {
  local url=$1; shift
  local t0 t1
  t0=$(now); "$psql" "$url" -Xq "$@" > /dev/null; t1=$(now)
  echo "$t1 - $t0" | bc -l
}
# the load: three runs each, the systems taking turns, as for the bulk copy (one
# PostgreSQL load took 7 s in one run and 12 s in the next); runs 1 and 2 go into
# streams/tables of their own, dropped after; run 3 loads h, which the queries read
declare -A result load_runs
for k in 1 2 3; do
  for system in sluice postgres; do
    url=$sl; [ $system = postgres ] && url=$pg
    table=h; [ $k -lt 3 ] && { table=load$k; create_bulk $system $table; }
    echo "== $system: load (run $k)" >&2
    sync
    t0=$(now)
    for f in "$work"/h*.csv; do
      "$psql" "$url" -Xqc "\\copy $table (customer, amount, payload) FROM '$f' WITH (FORMAT csv)"
    done
    t1=$(now)
    load_runs[$system]+=" $(echo "$t1 - $t0" | bc -l)"
    got=$("$psql" "$url" -XAtc "SELECT count(*) FROM $table")
    [ "$got" = "$rows" ] || { echo "$system: load has $got rows, expected $rows" >&2; exit 1; }
    if [ $k -lt 3 ]; then
      kind=TABLE; [ $system = sluice ] && kind=STREAM
      "$psql" "$url" -Xqc "DROP $kind $table"
    fi
  done
done
for system in sluice postgres; do
  result[$system,load]=$(median ${load_runs[$system]})
done
"$psql" "$pg" -Xqc "VACUUM ANALYZE h"
rss_kib=$(awk '/VmRSS/ { print $2 }' /proc/$sluice_pid/status)
# queries: the systems take turns, three runs each
declare -A runs
for k in 1 2 3; do
  for system in sluice postgres; do
    url=$sl; [ $system = postgres ] && url=$pg
    runs[$system,copy]+=" $(timed "$url" -c 'COPY (SELECT * FROM h) TO STDOUT')"
    runs[$system,group]+=" $(timed "$url" -c 'SELECT customer, count(*), sum(amount) FROM h GROUP BY customer')"
    runs[$system,filter]+=" $(timed "$url" -c "SELECT count(*) FROM h WHERE customer = 'c7'")"
  done
done
check_sl=$("$psql" "$sl" -XAtc "SELECT count(*), sum(amount) FROM h WHERE customer = 'c7'")
check_pg=$("$psql" "$pg" -XAtc "SELECT count(*), sum(amount) FROM h WHERE customer = 'c7'")
[ "$check_sl" = "$check_pg" ] || { echo "results differ: sluice $check_sl, postgres $check_pg" >&2; exit 1; }
bytes=$("$psql" "$sl" -XAtc "SELECT sum(bytes), sum(logical_bytes) FROM sluice_streams WHERE name = 'h'" 2>/dev/null || echo "?")

if [ -n "$json" ]; then
  printf '{"workload":"wide_history","query":"bulk","rows":%d,"bytes":%d,"sluice_seconds":%.4f,"postgres_seconds":%.4f,"sluice_peak_rss_mib":%d,"failed_copy_left":0,"compression":"%s"}\n' \
    "$bulk_rows" "$bulk_bytes" "${bulk[sluice]}" "${bulk[postgres]}" $((bulk_hwm_kib / 1024)) "${compression:-default}" >> "$json"
  for q in load copy group filter; do
    if [ $q = load ]; then s=${result[sluice,load]}; p=${result[postgres,load]}
    else s=$(median ${runs[sluice,$q]}); p=$(median ${runs[postgres,$q]}); fi
    printf '{"workload":"wide_history","query":"%s","rows":%d,"chunks":%d,"sluice_seconds":%.4f,"postgres_seconds":%.4f,"sluice_rss_mib":%d,"compression":"%s"}\n' \
      "$q" "$rows" "$chunks" "$s" "$p" $((rss_kib / 1024)) "${compression:-default}" >> "$json"
  done
  exit 0
fi
mkdir -p bench/results
md=bench/results/wide-$(date -u +%Y-%m-%dT%H%M%SZ).md
{
  echo "# Wide history: $rows rows of ~1 KiB, psql as the client"
  echo
  echo "\`bash bench/wide_history.sh --rows $rows${compression:+ --compression $compression}\` at $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores."
  echo "PostgreSQL 15 with shared_buffers = 2GB (bigserial + ts default now() + the same columns). Median of 3 runs per query; ratio = PostgreSQL / Sluice seconds (> 1: Sluice faster)."
  echo "Sluice stream bytes on disk, logical: $bytes. Sluice RSS after the load: $((rss_kib / 1024)) MiB. Check: c7 count, sum = $check_sl on both."
  echo
  echo "| workload | Sluice s | PostgreSQL s | ratio | Sluice runs | PostgreSQL runs |"
  echo "|---|---|---|---|---|---|"
  printf '| one \\copy of %d bytes (%d rows), median of 3 alternating runs; Sluice peak RSS %d MiB; the same with a bad row at 90%%: nothing visible on either | %.2f | %.2f | %.2fx | %s | %s |\n' \
    "$bulk_bytes" "$bulk_rows" $((bulk_hwm_kib / 1024)) "${bulk[sluice]}" "${bulk[postgres]}" \
    "$(echo "${bulk[postgres]} / ${bulk[sluice]}" | bc -l)" "${bulk_runs[sluice]}" "${bulk_runs[postgres]}"
  printf '| load (%d x \\copy of %d rows), median of 3 alternating runs | %.2f | %.2f | %.2fx | %s | %s |\n' $chunks $per_chunk "${result[sluice,load]}" "${result[postgres,load]}" \
    "$(echo "${result[postgres,load]} / ${result[sluice,load]}" | bc -l)" \
    "$(printf '%.2f ' ${load_runs[sluice]})" "$(printf '%.2f ' ${load_runs[postgres]})"
  for q in copy group filter; do
    case $q in
      copy) name="COPY (SELECT * FROM h) TO STDOUT" ;;
      group) name="SELECT customer, count(*), sum(amount) FROM h GROUP BY customer" ;;
      filter) name="SELECT count(*) FROM h WHERE customer = 'c7'" ;;
    esac
    s=$(median ${runs[sluice,$q]}); p=$(median ${runs[postgres,$q]})
    printf '| `%s` | %.3f | %.3f | %.2fx | %s | %s |\n' "$name" "$s" "$p" "$(echo "$p / $s" | bc -l)" \
      "$(printf '%.3f ' ${runs[sluice,$q]})" "$(printf '%.3f ' ${runs[postgres,$q]})"
  done
} > "$md"
cat "$md"
echo "results: $md" >&2
