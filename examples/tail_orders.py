"""Follow a Sluice stream from any offset with a plain Postgres driver.

A producer thread appends orders; the consumer declares a cursor over
`WHERE offset >= n` and FETCHes in a loop: each FETCH returns the rows
committed since the last one, or waits up to `tail_wait` for the next.
"""

import random
import threading
import time

import psycopg

DSN = "host=127.0.0.1 port=5499 user=sluice dbname=sluice"


def produce(stop: threading.Event) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        while not stop.is_set():
            conn.execute(
                "INSERT INTO orders (customer, amount) VALUES (%s, %s)",
                (random.choice(["ann", "bob", "cid"]), round(random.uniform(1, 100), 2)),
            )
            time.sleep(0.5)


def consume(start_offset: int) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SET tail_wait = '2s'")
        conn.execute(
            "DECLARE orders_tail CURSOR WITH HOLD FOR "
            "SELECT offset, ts, customer, amount FROM orders WHERE offset >= %s",
            (start_offset,),
        )
        while True:
            for offset, ts, customer, amount in conn.execute("FETCH 100 FROM orders_tail"):
                print(f"{offset:>6}  {ts:%H:%M:%S}  {customer:<4} {amount:>8}")


def main() -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("CREATE STREAM IF NOT EXISTS orders (customer text NOT NULL, amount numeric(12,2))")
    stop = threading.Event()
    threading.Thread(target=produce, args=(stop,), daemon=True).start()
    try:
        consume(0)
    except KeyboardInterrupt:
        stop.set()


if __name__ == "__main__":
    main()
