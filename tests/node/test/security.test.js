// node-postgres logs in with SCRAM-SHA-256 over TLS that verifies the server against a CA
// made for the test (tests/fixtures/tls/make-certs.sh), with channel binding
// (SCRAM-SHA-256-PLUS); a wrong password is 28P01.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { SluiceServer, TEST_TIMEOUT_MS } from '../lib/sluice.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PASSWORD = 'correct horse';

describe('SCRAM over TLS with node-postgres', { timeout: TEST_TIMEOUT_MS }, () => {
  const certs = mkdtempSync(path.join(tmpdir(), 'sluice-certs-'));
  execFileSync('bash', [path.resolve(HERE, '..', '..', 'fixtures', 'tls', 'make-certs.sh'), certs]);
  const server = new SluiceServer([
    '--password', PASSWORD,
    '--tls-cert', path.join(certs, 'server.pem'),
    '--tls-key', path.join(certs, 'server.key'),
  ]);
  const tls = { ca: readFileSync(path.join(certs, 'ca.pem')), servername: 'localhost' };
  before(async () => {
    await server.start();
  });
  after(async () => {
    await server.stop();
    rmSync(certs, { recursive: true, force: true });
  });

  test('connects with channel binding and the session is encrypted', async () => {
    const client = await server.connect({ password: PASSWORD, ssl: tls, enableChannelBinding: true });
    try {
      const { rows } = await client.query('SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()');
      assert.deepEqual(rows, [{ ssl: true, version: 'TLSv1.3' }]);
    } finally {
      await client.end();
    }
  });

  test('a wrong password is 28P01', async () => {
    await assert.rejects(server.connect({ password: 'wrong', ssl: tls }), (err) => err.code === '28P01');
  });
});
