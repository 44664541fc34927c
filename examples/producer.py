"""An idempotent producer: resend after a lost acknowledgement, append once.

The `orders` stream is created with `dedup_key = 'order_id'`: a row whose
`order_id` was already appended within `dedup_window` (before the new row's
commit time) is not appended again, and `INSERT ... RETURNING offset` gives
the offset of the original. So when a connection breaks before the
acknowledgement arrives, the producer simply sends the same row again: if
the first send committed, the resend is a no-op that returns the original
offset; if it did not, the resend appends it.

After the window a resend appends again — keep retries well inside the
window (it defaults to 5 minutes; here 10 minutes).

    pip install "psycopg[binary]>=3.2"
    python examples/producer.py --count 100
"""

import argparse
import random
import sys
import time

import psycopg

DDL = (
    "CREATE STREAM IF NOT EXISTS orders "
    "(order_id text NOT NULL, customer text NOT NULL, amount numeric(12,2)) "
    "WITH (dedup_key = 'order_id', dedup_window = '10 minutes')"
)
INSERT = "INSERT INTO orders (order_id, customer, amount) VALUES (%s, %s, %s) RETURNING offset"


def send(dsn: str, order: tuple, state: dict) -> int:
    """Append one order, reconnecting and resending until acknowledged."""
    backoff = 0.1
    while True:
        try:
            if state.get("conn") is None or state["conn"].closed:
                state["conn"] = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
            return state["conn"].execute(INSERT, order).fetchone()[0]
        except psycopg.OperationalError as e:
            print(f"send of {order[0]} failed ({str(e).strip()}); resending", flush=True)
            state["conn"] = None
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="host=127.0.0.1 port=5499 user=sluice dbname=sluice")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--prefix", default="order")
    p.add_argument(
        "--resend-each",
        action="store_true",
        help="send every order twice, as after a lost acknowledgement (shows dedup)",
    )
    args = p.parse_args()
    rng = random.Random(1)
    state: dict = {}
    with psycopg.connect(args.dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(DDL)
    for i in range(args.count):
        order = (f"{args.prefix}-{i}", rng.choice(["ann", "bob", "cid"]), round(rng.uniform(1, 100), 2))
        offset = send(args.dsn, order, state)
        if args.resend_each:
            again = send(args.dsn, order, state)
            print(f"{order[0]} -> offset {offset}, resent -> offset {again}", flush=True)
        else:
            print(f"{order[0]} -> offset {offset}", flush=True)
    if state.get("conn") is not None:
        state["conn"].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
