"""Exactly-once processing of a Sluice stream with a plain Postgres driver.

The consumer keeps per-customer totals of the `orders` stream in a table.
Each batch is one transaction that

  1. reads the consumer's position from `consumer_offsets`,
  2. FETCHes the next rows after it from a waiting cursor,
  3. adds their amounts to the totals table, and
  4. writes the new position to `consumer_offsets`,

and COMMITs. The position and the effects of the rows behind it commit
atomically (one replicated command), so however often the consumer or the
server is killed, every row is counted exactly once: a batch whose COMMIT
did not happen left no trace and is read again; one that committed is never
read again. A concurrent consumer under the same name makes one of the two
COMMITs fail with 40001 (serialization failure): the batch is retried.

What this does not promise: effects outside Sluice (an email, a call to
another service) can still happen twice — make those idempotent, or record
them in the same transaction and act on them afterwards.

    pip install "psycopg[binary]>=3.2"
    python examples/consumer.py --dsn "host=127.0.0.1 port=5499 user=sluice dbname=sluice"
"""

import argparse
import sys
import time
from collections import defaultdict
from decimal import Decimal

import psycopg
from psycopg import sql

POSITION = 'SELECT "offset" FROM consumer_offsets WHERE consumer = %s AND stream = %s'
COMMIT_POSITION = (
    "INSERT INTO consumer_offsets VALUES (%s, %s, %s) "
    'ON CONFLICT (consumer, stream) DO UPDATE SET "offset" = excluded."offset"'
)


def process_batch(conn: psycopg.Connection, args: argparse.Namespace) -> int | None:
    """One transaction: returns the new position, or None if no rows came."""
    totals = sql.Identifier(args.table)
    with conn.transaction():
        row = conn.execute(POSITION, (args.name, args.stream)).fetchone()
        position = row[0] if row else -1
        conn.execute(
            sql.SQL(
                'DECLARE batch CURSOR FOR SELECT "offset", customer, amount FROM {} '
                'WHERE "offset" > {} ORDER BY "offset"'
            ).format(sql.Identifier(args.stream), sql.Literal(position))
        )
        rows = conn.execute(sql.SQL("FETCH {} FROM batch").format(sql.Literal(args.batch))).fetchall()
        conn.execute("CLOSE batch")
        if not rows:
            return None
        sums: dict[str, Decimal] = defaultdict(Decimal)
        for _, customer, amount in rows:
            sums[customer] += amount or 0
        for customer, amount in sums.items():
            conn.execute(
                sql.SQL(
                    "INSERT INTO {t} VALUES (%s, %s) "
                    "ON CONFLICT (customer) DO UPDATE SET total = {t}.total + excluded.total"
                ).format(t=totals),
                (customer, amount),
            )
        last = rows[-1][0]
        conn.execute(COMMIT_POSITION, (args.name, args.stream, last))
    return last


def consume(conn: psycopg.Connection, args: argparse.Namespace) -> bool:
    """Process batches until done; True when the stop condition is met."""
    conn.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (customer text PRIMARY KEY, total numeric NOT NULL)")
        .format(sql.Identifier(args.table))
    )
    conn.execute(sql.SQL("SET tail_wait = {}").format(sql.Literal(f"{args.wait_ms}ms")))
    idle_since = time.monotonic()
    while True:
        try:
            last = process_batch(conn, args)
        except psycopg.errors.SerializationFailure:
            print("serialization failure: retrying the batch", flush=True)
            continue
        if last is None:
            if args.stop_after_idle is not None and time.monotonic() - idle_since > args.stop_after_idle:
                print("idle: stopping", flush=True)
                return True
            continue
        idle_since = time.monotonic()
        print(f"committed through offset {last}", flush=True)
        if args.until_offset is not None and last >= args.until_offset:
            return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="host=127.0.0.1 port=5499 user=sluice dbname=sluice")
    p.add_argument("--name", default="totals-consumer", help="consumer name in consumer_offsets")
    p.add_argument("--stream", default="orders")
    p.add_argument("--table", default="customer_totals")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--wait-ms", type=int, default=1000, help="tail_wait of each FETCH")
    p.add_argument("--until-offset", type=int, help="stop after committing this offset")
    p.add_argument("--stop-after-idle", type=float, help="stop after this many seconds without rows")
    args = p.parse_args()
    backoff = 0.1
    while True:
        try:
            with psycopg.connect(args.dsn, autocommit=True, connect_timeout=5) as conn:
                backoff = 0.1
                if consume(conn, args):
                    return 0
        except psycopg.OperationalError as e:
            # the server went away (or is restarting): whatever the last
            # batch did is either committed or not at all; start over
            print(f"connection lost ({str(e).strip()}); reconnecting", flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


if __name__ == "__main__":
    sys.exit(main())
