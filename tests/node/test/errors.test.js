// node-postgres against a real sluice server: errors carry PostgreSQL's
// SQLSTATE in `err.code`, both for simple queries (no parameters: a Query
// message) and extended-protocol ones (parameters: Parse/Bind/Execute), and
// the connection stays usable afterwards.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { SluiceServer, TEST_TIMEOUT_MS } from '../lib/sluice.js';

const CASES = [
  { name: 'UPDATE is not supported on a stream', sql: 'UPDATE orders SET amount = 0', code: '0A000', message: /append-only/ },
  { name: 'UPDATE with a parameter', sql: 'UPDATE orders SET amount = $1 WHERE customer = $2', params: ['1', 'ann'], code: '0A000', message: /append-only/ },
  { name: 'DELETE without an offset prefix', sql: 'DELETE FROM orders WHERE customer = $1', params: ['ann'], code: '0A000', message: /append-only/ },
  { name: 'unknown table', sql: 'SELECT * FROM no_such_stream', code: '42P01' },
  { name: 'unknown table with a parameter', sql: 'INSERT INTO no_such_stream VALUES ($1)', params: ['x'], code: '42P01' },
  { name: 'syntax error', sql: 'SELEC 1', code: '42601' },
  { name: 'syntax error with a parameter', sql: 'SELECT * FROM orders WHERE customer = $1 ORDER', params: ['ann'], code: '42601' },
  { name: 'unknown column', sql: 'SELECT no_such_column FROM orders', code: '42703' },
  { name: 'NOT NULL violation', sql: 'INSERT INTO orders (customer, amount) VALUES ($1, $2)', params: [null, '1'], code: '23502' },
  { name: 'bad numeric value', sql: 'INSERT INTO orders (customer, amount) VALUES ($1, $2)', params: ['ann', 'abc'], code: '22P02' },
  { name: 'stream already exists', sql: 'CREATE STREAM orders (x integer)', code: '42P07' },
];

describe('SQLSTATEs through node-postgres', { timeout: TEST_TIMEOUT_MS }, () => {
  const server = new SluiceServer();
  let client;
  before(async () => {
    await server.start();
    client = await server.connect();
    await client.query('CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)');
    await client.query('INSERT INTO orders (customer, amount) VALUES ($1, $2)', ['ann', '1.50']);
  });
  after(async () => {
    if (client) await client.end();
    await server.stop();
  });

  for (const c of CASES) {
    test(`${c.code}: ${c.name}`, async () => {
      await assert.rejects(client.query(c.sql, c.params), (err) => {
        assert.equal(err.code, c.code, `SQLSTATE of ${c.sql}: ${err.message}`);
        assert.equal(err.severity, 'ERROR');
        if (c.message) assert.match(err.message, c.message);
        return true;
      });
      // The connection is still usable and nothing changed.
      const rows = await client.query('SELECT customer, amount FROM orders ORDER BY offset');
      assert.deepEqual(rows.rows, [{ customer: 'ann', amount: '1.50' }]);
    });
  }
});
