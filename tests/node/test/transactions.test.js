// node-postgres against a real sluice server: BEGIN/COMMIT and ROLLBACK sent
// as simple queries around parameterized INSERTs, seen from a second
// connection.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { SluiceServer, TEST_TIMEOUT_MS } from '../lib/sluice.js';

describe('transactions through node-postgres', { timeout: TEST_TIMEOUT_MS }, () => {
  const server = new SluiceServer();
  let reader;
  before(async () => {
    await server.start();
    reader = await server.connect();
  });
  after(async () => {
    if (reader) await reader.end();
    await server.stop();
  });

  // Each test writes on its own connection, so one left inside a transaction
  // by a failed assertion cannot affect the next test.
  function withWriter(body) {
    return async () => {
      const writer = await server.connect();
      try {
        await body(writer);
      } finally {
        await writer.end();
      }
    };
  }

  const bodies = async (stream) => (await reader.query(`SELECT body FROM ${stream} ORDER BY offset`)).rows.map((r) => r.body);

  test('BEGIN ... COMMIT makes the rows visible at once, in order', withWriter(async (writer) => {
    await writer.query('CREATE STREAM committed (body text, n integer)');
    const begin = await writer.query('BEGIN');
    assert.equal(begin.command, 'BEGIN');
    await writer.query('INSERT INTO committed VALUES ($1, $2)', ['a', 1]);
    await writer.query('INSERT INTO committed VALUES ($1, $2), ($3, $4)', ['b', 2, 'c', 3]);
    assert.deepEqual(await bodies('committed'), [], 'uncommitted rows are invisible to other sessions');
    const commit = await writer.query('COMMIT');
    assert.equal(commit.command, 'COMMIT');
    assert.deepEqual(await bodies('committed'), ['a', 'b', 'c']);
    const offsets = await reader.query('SELECT offset FROM committed ORDER BY offset');
    assert.deepEqual(offsets.rows.map((r) => r.offset), ['0', '1', '2']);
  }));

  // Offsets and ts of the block's own rows are NULL until COMMIT assigns them.
  test('a transaction reads its own uncommitted rows', withWriter(async (writer) => {
    await writer.query('CREATE STREAM own_rows (body text)');
    await writer.query('INSERT INTO own_rows VALUES ($1)', ['before']);
    await writer.query('BEGIN');
    try {
      await writer.query('INSERT INTO own_rows VALUES ($1), ($2)', ['x', 'y']);
      // (Offsets are assigned at commit, so the rows are compared as a set.)
      const inside = await writer.query('SELECT body FROM own_rows');
      assert.deepEqual(inside.rows.map((r) => r.body).sort(), ['before', 'x', 'y']);
      assert.deepEqual(await bodies('own_rows'), ['before'], 'other sessions do not see them');
    } finally {
      await writer.query('ROLLBACK');
    }
    assert.deepEqual(await bodies('own_rows'), ['before']);
  }));

  test('ROLLBACK discards the rows', withWriter(async (writer) => {
    await writer.query('CREATE STREAM rolled (body text)');
    await writer.query('INSERT INTO rolled VALUES ($1)', ['kept']);
    await writer.query('BEGIN');
    await writer.query('INSERT INTO rolled VALUES ($1)', ['discarded']);
    const rollback = await writer.query('ROLLBACK');
    assert.equal(rollback.command, 'ROLLBACK');
    assert.deepEqual(await bodies('rolled'), ['kept']);
    // Offsets stay gapless: the next committed row follows the last one.
    const next = await writer.query('INSERT INTO rolled VALUES ($1) RETURNING offset', ['after']);
    assert.deepEqual(next.rows, [{ offset: '1' }]);
    assert.deepEqual(await bodies('rolled'), ['kept', 'after']);
  }));

  test('an error aborts the transaction until ROLLBACK (25P02)', withWriter(async (writer) => {
    await writer.query('CREATE STREAM aborted (body text)');
    await writer.query('BEGIN');
    await writer.query('INSERT INTO aborted VALUES ($1)', ['lost']);
    await assert.rejects(writer.query('INSERT INTO nowhere VALUES ($1)', ['x']), { code: '42P01' });
    await assert.rejects(writer.query('INSERT INTO aborted VALUES ($1)', ['ignored']), { code: '25P02' });
    await assert.rejects(writer.query('SELECT 1'), { code: '25P02' });
    await writer.query('ROLLBACK');
    assert.deepEqual(await bodies('aborted'), []);
    const after = await writer.query('SELECT count(*) AS n FROM aborted');
    assert.equal(Number(after.rows[0].n), 0);
  }));

  test('COMMIT of a failed transaction rolls it back', withWriter(async (writer) => {
    await writer.query('CREATE STREAM failed_commit (body text)');
    await writer.query('BEGIN');
    await writer.query('INSERT INTO failed_commit VALUES ($1)', ['lost']);
    await assert.rejects(writer.query('SELEC 1'), { code: '42601' });
    const commit = await writer.query('COMMIT');
    assert.equal(commit.command, 'ROLLBACK', 'PostgreSQL answers COMMIT in a failed transaction with ROLLBACK');
    assert.deepEqual(await bodies('failed_commit'), []);
    await writer.query('INSERT INTO failed_commit VALUES ($1)', ['autocommitted']);
    assert.deepEqual(await bodies('failed_commit'), ['autocommitted']);
  }));
});
