// Starts a real `sluice serve` process for one test file.
//
// The binary is $SLUICE_BIN, else ../../target/debug/sluice relative to this
// folder (build it with `cargo build --bins`). The server gets a fresh
// temporary data directory and a random loopback port; everything it prints
// is forwarded to stderr, prefixed with `[sluice] `.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

const STARTUP_TIMEOUT_MS = 60_000;
const SHUTDOWN_TIMEOUT_MS = 30_000;
const LISTENING = /listening on (\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)/;
const HERE = path.dirname(fileURLToPath(import.meta.url));

// Bounds for every client operation, so a stuck server fails a test instead of
// hanging the run.
export const QUERY_TIMEOUT_MS = 15_000;
export const TEST_TIMEOUT_MS = 60_000;

export function sluiceBinary() {
  const bin = process.env.SLUICE_BIN || path.resolve(HERE, '..', '..', '..', 'target', 'debug', 'sluice');
  if (!existsSync(bin)) {
    throw new Error(`no sluice binary at ${bin}: run \`cargo build --bins\` or set SLUICE_BIN`);
  }
  return bin;
}

export class SluiceServer {
  // `args`: extra `serve` flags.
  constructor(args = []) {
    this.args = args;
    this.dataDir = null;
    this.child = null;
    this.port = null;
  }

  async start() {
    this.dataDir = mkdtempSync(path.join(tmpdir(), 'sluice-node-'));
    const child = spawn(sluiceBinary(), ['serve', '--data-dir', this.dataDir, '--listen', '127.0.0.1:0', ...this.args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, NO_COLOR: '1' },
    });
    this.child = child;
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    this.port = await new Promise((resolve, reject) => {
      let announced = false;
      const timer = setTimeout(() => {
        reject(new Error(`sluice did not print \`listening on HOST:PORT\` within ${STARTUP_TIMEOUT_MS} ms`));
      }, STARTUP_TIMEOUT_MS);
      const forward = (stream) => {
        let pending = '';
        stream.setEncoding('utf8');
        stream.on('data', (chunk) => {
          pending += chunk;
          let newline;
          while ((newline = pending.indexOf('\n')) >= 0) {
            const line = pending.slice(0, newline);
            pending = pending.slice(newline + 1);
            process.stderr.write(`[sluice] ${line}\n`);
            const match = LISTENING.exec(line);
            if (match && !announced) {
              announced = true;
              clearTimeout(timer);
              resolve(Number(match[2]));
            }
          }
        });
        stream.on('end', () => {
          if (pending) process.stderr.write(`[sluice] ${pending}\n`);
        });
      };
      forward(child.stdout);
      forward(child.stderr);
      child.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      child.once('exit', (code, signal) => {
        if (!announced) {
          clearTimeout(timer);
          reject(new Error(`sluice exited (code ${code}, signal ${signal}) before printing \`listening on HOST:PORT\``));
        }
      });
    });
    return this;
  }

  async stop() {
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      let timer;
      const timedOut = new Promise((resolve) => {
        timer = setTimeout(() => resolve('timeout'), SHUTDOWN_TIMEOUT_MS);
      });
      if ((await Promise.race([this.exited, timedOut])) === 'timeout') {
        child.kill('SIGKILL');
        await this.exited;
      }
      clearTimeout(timer);
    }
    if (this.dataDir) {
      rmSync(this.dataDir, { recursive: true, force: true });
      this.dataDir = null;
    }
  }

  config(extra = {}) {
    return {
      host: '127.0.0.1',
      port: this.port,
      user: 'sluice',
      database: 'sluice',
      connectionTimeoutMillis: 10_000,
      query_timeout: QUERY_TIMEOUT_MS,
      ...extra,
    };
  }

  // A connected client; the caller ends it.
  async connect(extra = {}) {
    const client = new pg.Client(this.config(extra));
    // A server-side error on an idle client must not crash the test process.
    client.on('error', (err) => process.stderr.write(`[client error] ${err.stack}\n`));
    await client.connect();
    return client;
  }
}

// Rejects if `promise` does not settle within `ms` (for pg-cursor reads,
// which node-postgres's query_timeout does not cover).
export function within(ms, promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
