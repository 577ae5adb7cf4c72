// Test support for `kvtier-llama serve`: a generated chat model, servers started and stopped
// as real processes, curl for the raw protocol, the OpenAI SDK for the client's view.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const build = process.env.KVT_BUILD_DIR;
if (!build) throw new Error('KVT_BUILD_DIR is not set (run through scripts/run-node-tests.sh)');
export const cli = join(build, 'kvtier-llama');
const require = createRequire(join(build, '..', 'node', 'package.json'));
export const OpenAI = require('openai').default;

// A scratch directory with the tiny chat model (2 layers, dim 64, byte vocabulary).
export function scratch() {
  const dir = mkdtempSync(join(process.env.KVT_SCRATCH || tmpdir(), 'serve-'));
  execFileSync(cli, ['gen-model', 'chat', join(dir, 'chat.gguf')]);
  return { dir, model: join(dir, 'chat.gguf'), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

// Start a server; resolves once it listens: { url, port, proc, log(), exited }.
export function start(model, cacheDir, extra = []) {
  const args = ['serve', '-m', model, '--cache-dir', cacheDir, '--port', '0', '--threads', '1',
    '--ctx', '512', ...extra];
  const proc = spawn(cli, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise((res) => proc.on('exit', (code, signal) => {
    if (code !== 0 && signal !== 'SIGKILL') console.error(`server exited ${code ?? signal}:\n${log}`);
    res({ code, signal });
  }));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start: ' + log)), 30000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/[^ ]+:(\d+))/.exec(log);
      if (m && timer) {
        clearTimeout(timer);
        resolve({ url: m[1], port: Number(m[2]), proc, log: () => log, exited });
      }
    });
    proc.on('exit', () => reject(new Error('server exited: ' + log)));
  });
}

export async function stop(srv, signal = 'SIGTERM') {
  srv.proc.kill(signal);
  return srv.exited;
}

export function client(srv) {
  return new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
}

// curl, returning { status, body } (body parsed when JSON).
export function curl(srv, path, body, method) {
  const args = ['-s', '-w', '\n%{http_code}', srv.url + path];
  if (method) args.push('-X', method);
  if (body !== undefined) args.push('-H', 'Content-Type: application/json', '--data-binary',
    typeof body === 'string' ? body : JSON.stringify(body));
  const out = execFileSync('curl', args, { encoding: 'utf8' });
  const nl = out.lastIndexOf('\n');
  const text = out.slice(0, nl);
  let parsed = text;
  try { parsed = JSON.parse(text); } catch { /* not JSON */ }
  return { status: Number(out.slice(nl + 1)), body: parsed, text };
}

export async function metrics(srv) {
  const text = await (await fetch(srv.url + '/metrics')).text();
  const m = {};
  for (const line of text.split('\n')) {
    const r = /^(kvtier_[a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (r) m[r[1]] = Number(r[2]);
  }
  return m;
}

// Wait until the write-behind has put everything on disk.
export async function durable(srv, entries = 1) {
  for (let i = 0; i < 300; i++) {
    const m = await metrics(srv);
    if (m['kvtier_pending_writes'] === 0 && m['kvtier_cache_entries{tier="disk"}'] >= entries) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('the cache never reached the disk');
}

// `kvtier stats DIR --json` of a server's cache directory: the store of its one model.
export function stats(cacheDir) {
  const out = JSON.parse(execFileSync(join(build, 'kvtier'), ['stats', cacheDir, '--json'], { encoding: 'utf8' }));
  if (out.length !== 1) throw new Error(`${cacheDir} holds ${out.length} stores`);
  return out[0];
}

export const chat = (messages, extra = {}) =>
  ({ model: 'chat', messages, max_tokens: 24, temperature: 0, ...extra });
