// pg-cursor against a real sluice server. A cursor sends Parse/Bind/Describe
// with Flush (no Sync), then one `Execute(portal, rows = n)` + Flush per
// read(n); the server answers PortalSuspended until the portal is exhausted
// (CommandComplete). Every query here is finite: either it does not bound
// `offset` from below (a snapshot), or it has a LIMIT that the rows already
// committed satisfy.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Cursor from 'pg-cursor';
import { QUERY_TIMEOUT_MS, SluiceServer, TEST_TIMEOUT_MS, within } from '../lib/sluice.js';

const CUSTOMERS = ['ann', 'bob', 'cid', 'dee', 'eve', 'fay', 'gus'];

describe('pg-cursor', { timeout: TEST_TIMEOUT_MS }, () => {
  const server = new SluiceServer();
  let client;
  before(async () => {
    await server.start();
    // No query_timeout on this client: node-postgres arms it for a Cursor too
    // but never clears it, which would fire after the test. Reads are bounded
    // by within() and the test timeout instead.
    client = await server.connect({ query_timeout: 0 });
    await client.query('CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)');
    for (const [i, customer] of CUSTOMERS.entries()) {
      await client.query('INSERT INTO orders (customer, amount, note) VALUES ($1, $2, $3)',
        [customer, `${i}.25`, i % 2 ? null : `note ${i}`]);
    }
  });
  after(async () => {
    if (client) await client.end();
    await server.stop();
  });

  const read = (cursor, n) => within(QUERY_TIMEOUT_MS, cursor.read(n), `cursor.read(${n})`);
  const close = (cursor) => within(QUERY_TIMEOUT_MS, cursor.close(), 'cursor.close()');

  async function stillUsable() {
    const result = await client.query('SELECT count(*) AS n FROM orders');
    assert.equal(Number(result.rows[0].n), CUSTOMERS.length);
  }

  test('reads a LIMITed SELECT * in batches of 2', async () => {
    const cursor = client.query(new Cursor('SELECT * FROM orders WHERE offset >= 0 LIMIT 5'));
    try {
      const batches = [];
      for (let i = 0; i < 4; i++) batches.push(await read(cursor, 2));
      assert.deepEqual(batches.map((b) => b.length), [2, 2, 1, 0]);
      const rows = batches.flat();
      assert.deepEqual(Object.keys(rows[0]), ['offset', 'ts', 'customer', 'amount', 'note']);
      assert.deepEqual(rows.map((r) => [r.offset, r.customer, r.amount, r.note]), [
        ['0', 'ann', '0.25', 'note 0'],
        ['1', 'bob', '1.25', null],
        ['2', 'cid', '2.25', 'note 2'],
        ['3', 'dee', '3.25', null],
        ['4', 'eve', '4.25', 'note 4'],
      ]);
      assert.ok(rows.every((r) => r.ts instanceof Date), 'ts is a timestamptz');
    } finally {
      await close(cursor);
    }
    await stillUsable();
  });

  test('reads a parameterized snapshot query to the end', async () => {
    const cursor = client.query(new Cursor(
      'SELECT offset, customer FROM orders WHERE customer <> $1 ORDER BY offset', ['bob']));
    try {
      const batches = [];
      for (let i = 0; i < 4; i++) batches.push(await read(cursor, 3));
      assert.deepEqual(batches.map((b) => b.map((r) => r.customer)),
        [['ann', 'cid', 'dee'], ['eve', 'fay', 'gus'], [], []]);
      assert.deepEqual(batches.flat().map((r) => r.offset), ['0', '2', '3', '4', '5', '6']);
    } finally {
      await close(cursor);
    }
    await stillUsable();
  });

  test('a cursor closed before its end leaves the connection usable', async () => {
    const cursor = client.query(new Cursor(
      'SELECT customer FROM orders WHERE offset >= $1 AND offset < $2 ORDER BY offset', [1, 6]));
    try {
      assert.deepEqual((await read(cursor, 2)).map((r) => r.customer), ['bob', 'cid']);
    } finally {
      await close(cursor);
    }
    await stillUsable();
    const again = client.query(new Cursor('SELECT customer FROM orders WHERE offset >= 5 LIMIT 2'));
    try {
      assert.deepEqual((await read(again, 10)).map((r) => r.customer), ['fay', 'gus']);
      assert.deepEqual(await read(again, 10), []);
    } finally {
      await close(again);
    }
    await stillUsable();
  });
});
