// node-postgres against a real sluice server: connecting, CREATE STREAM, and a
// parameterized INSERT of every supported column type read back with
// node-postgres's default parsers and as the server's text.
//
// node-postgres sends a query with parameters as an unnamed Parse whose
// parameter types are all 0 (the server infers them from the statement),
// then Bind with text values (Buffers go as binary), Describe, Execute, Sync.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { SluiceServer, TEST_TIMEOUT_MS } from '../lib/sluice.js';

const COLUMNS = ['flag', 'i2', 'i4', 'i8', 'f4', 'f8', 'num', 'txt', 'vc', 'bin',
  'tstz', 'tsp', 'day', 'doc', 'docb', 'id'];
const TYPED_DDL = 'CREATE STREAM typed (flag boolean, i2 smallint, i4 integer, i8 bigint, f4 real, '
  + 'f8 double precision, num numeric(10,3), txt text, vc varchar(5), bin bytea, '
  + 'tstz timestamptz, tsp timestamp, day date, doc json, docb jsonb, id uuid)';
const INSERT = `INSERT INTO typed (${COLUMNS.join(', ')}) `
  + `VALUES (${COLUMNS.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING offset`;
const SELECT = `SELECT ${COLUMNS.join(', ')} FROM typed ORDER BY offset`;

// What a node-postgres user passes for each column.
const FULL = [true, 12, 345, '6789012345', 1.5, 2.25, '12.5', 'hello world', 'abc',
  Buffer.from('deadbeef', 'hex'), new Date(Date.UTC(2024, 0, 2, 3, 4, 5, 123)),
  '2024-01-02 03:04:05.123456', '2024-02-29', { a: [1, 2] }, { b: 2, a: 1 },
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'];
const EDGES = [false, -32768, -2147483648, 9223372036854775807n, -0.25, 0.1, '-0.001', '', 'abcde',
  Buffer.alloc(0), new Date(0), '1999-12-31 23:59:59.5', '1970-01-01',
  '[]', // an Array would be sent as a PostgreSQL array literal, so JSON arrays go as text
  { nested: { k: null } }, '00000000-0000-0000-0000-000000000000'];
const NULLS = COLUMNS.map(() => null);

// What node-postgres's default type parsers return. timestamp and date
// (no time zone) are parsed in the local time zone.
const FULL_BACK = [true, 12, 345, '6789012345', 1.5, 2.25, '12.500', 'hello world', 'abc',
  Buffer.from('deadbeef', 'hex'), new Date(Date.UTC(2024, 0, 2, 3, 4, 5, 123)),
  new Date(2024, 0, 2, 3, 4, 5, 123), new Date(2024, 1, 29), { a: [1, 2] }, { a: 1, b: 2 },
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'];
const EDGES_BACK = [false, -32768, -2147483648, '9223372036854775807', -0.25, 0.1, '-0.001', '',
  'abcde', Buffer.alloc(0), new Date(0), new Date(1999, 11, 31, 23, 59, 59, 500),
  new Date(1970, 0, 1), [], { nested: { k: null } }, '00000000-0000-0000-0000-000000000000'];

// The server's text for the columns whose output does not depend on the
// session time zone (as PostgreSQL prints them).
const RAW_FULL = {
  flag: 't', i2: '12', i4: '345', i8: '6789012345', f4: '1.5', f8: '2.25', num: '12.500',
  txt: 'hello world', vc: 'abc', bin: '\\xdeadbeef', tsp: '2024-01-02 03:04:05.123456',
  day: '2024-02-29', doc: '{"a":[1,2]}', docb: '{"a": 1, "b": 2}',
  id: 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
};
const RAW_EDGES = {
  flag: 'f', i2: '-32768', i4: '-2147483648', i8: '9223372036854775807', f4: '-0.25', f8: '0.1',
  num: '-0.001', txt: '', vc: 'abcde', bin: '\\x', tsp: '1999-12-31 23:59:59.5', day: '1970-01-01',
  doc: '[]', docb: '{"nested": {"k": null}}', id: '00000000-0000-0000-0000-000000000000',
};

const OID = {
  bool: 16, bytea: 17, int8: 20, int2: 21, int4: 23, text: 25, json: 114, float4: 700,
  float8: 701, varchar: 1043, date: 1082, timestamp: 1114, timestamptz: 1184, numeric: 1700,
  uuid: 2950, jsonb: 3802,
};

const asRow = (values) => Object.fromEntries(COLUMNS.map((c, i) => [c, values[i]]));
const rawText = { getTypeParser: () => (value) => value };

describe('node-postgres basics', { timeout: TEST_TIMEOUT_MS }, () => {
  const server = new SluiceServer();
  before(() => server.start());
  after(() => server.stop());

  test('connects and answers simple and parameterized queries', async () => {
    const client = await server.connect();
    try {
      const one = await client.query('SELECT 1 AS one');
      assert.equal(one.rows.length, 1);
      assert.equal(Number(one.rows[0].one), 1);
      const version = await client.query('SELECT version() AS v');
      assert.match(version.rows[0].v, /^PostgreSQL \d+\.\d+/);
      const sum = await client.query('SELECT $1::bigint + 1 AS n', [41]);
      assert.deepEqual(sum.rows, [{ n: '42' }]);
    } finally {
      await client.end();
    }
  });

  test('current_database() names the database of the connection string', async () => {
    const client = await server.connect();
    try {
      const db = await client.query('SELECT current_database() AS db');
      assert.deepEqual(db.rows, [{ db: 'sluice' }]);
    } finally {
      await client.end();
    }
  });

  test('integer literals and integer arithmetic are int4 as in PostgreSQL', async () => {
    const client = await server.connect();
    try {
      // PostgreSQL types `1` as integer (int4), which node-postgres parses to
      // a number; bigint (int8) would come back as a string.
      const literal = await client.query('SELECT 1 AS one');
      assert.deepEqual(literal.fields.map((f) => f.dataTypeID), [OID.int4]);
      assert.deepEqual(literal.rows, [{ one: 1 }]);
      const sum = await client.query('SELECT $1::integer + 1 AS n', [41]);
      assert.deepEqual(sum.fields.map((f) => f.dataTypeID), [OID.int4]);
      assert.deepEqual(sum.rows, [{ n: 42 }]);
    } finally {
      await client.end();
    }
  });

  test('CREATE STREAM, INSERT and SELECT *', async () => {
    const client = await server.connect();
    try {
      const created = await client.query(
        'CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)');
      assert.equal(created.command, 'CREATE');
      const inserted = await client.query(
        'INSERT INTO orders (customer, amount, note) VALUES ($1, $2, $3), ($4, $5, $6)',
        ['ann', '10.5', null, 'bob', 3, 'second']);
      assert.equal(inserted.command, 'INSERT');
      assert.equal(inserted.rowCount, 2);
      const result = await client.query('SELECT * FROM orders');
      assert.deepEqual(result.fields.map((f) => f.name), ['offset', 'ts', 'customer', 'amount', 'note']);
      assert.deepEqual(result.fields.map((f) => f.dataTypeID),
        [OID.int8, OID.timestamptz, OID.text, OID.numeric, OID.text]);
      assert.deepEqual(result.rows.map(({ offset, customer, amount, note }) => [offset, customer, amount, note]),
        [['0', 'ann', '10.50', null], ['1', 'bob', '3.00', 'second']]);
      for (const row of result.rows) {
        assert.ok(row.ts instanceof Date && !Number.isNaN(row.ts.getTime()), `ts ${row.ts}`);
      }
      assert.ok(result.rows[0].ts <= result.rows[1].ts, 'ts never decreases');
    } finally {
      await client.end();
    }
  });

  test('parameterized INSERT of every supported type round-trips', async () => {
    const client = await server.connect();
    try {
      await client.query(TYPED_DDL);
      const offsets = [];
      for (const values of [FULL, NULLS, EDGES]) {
        const result = await client.query(INSERT, values);
        assert.equal(result.rowCount, 1);
        offsets.push(result.rows[0].offset);
      }
      assert.deepEqual(offsets, ['0', '1', '2']);

      const parsed = await client.query(SELECT);
      assert.deepEqual(parsed.fields.map((f) => f.name), COLUMNS);
      assert.deepEqual(parsed.fields.map((f) => f.dataTypeID), [OID.bool, OID.int2, OID.int4, OID.int8,
        OID.float4, OID.float8, OID.numeric, OID.text, OID.varchar, OID.bytea, OID.timestamptz,
        OID.timestamp, OID.date, OID.json, OID.jsonb, OID.uuid]);
      assert.equal(parsed.rows.length, 3);
      assert.deepEqual(parsed.rows[0], asRow(FULL_BACK), 'full row');
      assert.deepEqual(parsed.rows[1], asRow(NULLS), 'all-NULL row');
      assert.deepEqual(parsed.rows[2], asRow(EDGES_BACK), 'edge-value row');

      const raw = await client.query({ text: SELECT, types: rawText });
      const { tstz: tstzFull, ...rawFull } = raw.rows[0];
      const { tstz: tstzEdges, ...rawEdges } = raw.rows[2];
      assert.deepEqual(rawFull, RAW_FULL, 'full row as text');
      assert.deepEqual(rawEdges, RAW_EDGES, 'edge-value row as text');
      assert.equal(new Date(tstzFull.replace(' ', 'T').replace(/([+-]\d\d)$/, '$1:00')).getTime(),
        Date.UTC(2024, 0, 2, 3, 4, 5, 123), `timestamptz text ${tstzFull}`);
      assert.equal(new Date(tstzEdges.replace(' ', 'T').replace(/([+-]\d\d)$/, '$1:00')).getTime(), 0,
        `timestamptz text ${tstzEdges}`);
    } finally {
      await client.end();
    }
  });

  test('parameters in WHERE are inferred from the compared column', async () => {
    const client = await server.connect();
    try {
      await client.query('CREATE STREAM events (kind text, n bigint, at timestamptz)');
      await client.query('INSERT INTO events VALUES ($1, $2, $3), ($4, $5, $6), ($7, $8, $9)',
        ['a', 1, new Date(Date.UTC(2024, 0, 1)), 'b', 2, new Date(Date.UTC(2024, 0, 2)),
          'a', 3, new Date(Date.UTC(2024, 0, 3))]);
      const result = await client.query(
        'SELECT n FROM events WHERE kind = $1 AND n >= $2 AND at < $3 AND offset >= $4 ORDER BY offset',
        ['a', '1', new Date(Date.UTC(2024, 0, 4)), 0]);
      assert.deepEqual(result.rows, [{ n: '1' }, { n: '3' }]);
    } finally {
      await client.end();
    }
  });
});
