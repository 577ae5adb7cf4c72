// kvtier-llama serve --redis: two servers with their own cache directories share prefixes
// through a real redis-server; a URL that cannot work fails the start with the server's own
// error, the password never shown.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { cli, scratch, start, stop, client, metrics, chat } from './server.mjs';

const PASSWORD = 'hunter2-secret';
let s, redis, port;

// A port nothing listens on (the OS picks it, then it is let go).
function freePort() {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, '127.0.0.1', () => {
      const p = srv.address().port;
      srv.close(() => resolve(p));
    });
  });
}

// redis-server as tests/support/redis_srv.c starts it (no persistence, loopback only), with a
// password; up once PING answers.
async function startRedis(dir) {
  const p = await freePort();
  const proc = spawn('/usr/bin/redis-server', ['--bind', '127.0.0.1', '--port', String(p),
    '--save', '', '--appendonly', 'no', '--dir', dir, '--logfile', join(dir, `redis-${p}.log`),
    '--protected-mode', 'no', '--requirepass', PASSWORD], { stdio: 'ignore' });
  for (let i = 0; i < 250; i++) {
    const r = spawnSync('redis-cli', ['-h', '127.0.0.1', '-p', String(p), 'PING'], { encoding: 'utf8' });
    if (/PONG|NOAUTH/.test(r.stdout)) return { proc, port: p };
    await new Promise((res) => setTimeout(res, 20));
  }
  proc.kill('SIGKILL');
  throw new Error('redis-server did not start');
}

before(async () => {
  s = scratch();
  ({ proc: redis, port } = await startRedis(s.dir));
});
after(() => {
  redis.kill('SIGKILL'); // by its pid: the process this suite started
  s.cleanup();
});

const url = (pass, p = port) => `redis://:${pass}@127.0.0.1:${p}/serve-test`;

// A server that must fail at start: { status, log }.
function failedStart(redisUrl) {
  const r = spawnSync(cli, ['serve', '-m', s.model, '--cache-dir', join(s.dir, 'never'),
    '--port', '0', '--threads', '1', '--ctx', '512', '--redis', redisUrl],
  { encoding: 'utf8', timeout: 60000 });
  return { status: r.status, log: r.stderr };
}

async function remoteEntries(srv, n) {
  for (let i = 0; i < 200; i++) {
    if ((await metrics(srv))['kvtier_cache_entries{tier="remote"}'] >= n) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('the remote tier never showed the entry');
}

test('two servers, two cache directories, one Redis: a prefix computed by one is served by the other', async () => {
  const [x, y] = await Promise.all([
    start(s.model, join(s.dir, 'cache-x'), ['--redis', url(PASSWORD)]),
    start(s.model, join(s.dir, 'cache-y'), ['--redis', url(PASSWORD)]),
  ]);
  try {
    assert.match(x.log(), /remote redis:\/\/:\*\*\*@127\.0\.0\.1:\d+\/serve-test\)/);
    assert.ok(!x.log().includes(PASSWORD));
    const msgs = [{ role: 'user', content: 'Computed on the first host, '.repeat(6) }];
    const a = await client(x).chat.completions.create(chat(msgs, { max_tokens: 8 }));
    assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
    await remoteEntries(y, 1); // uploaded by x, merged into y's view of the index
    const b = await client(y).chat.completions.create(chat(msgs, { max_tokens: 8 }));
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    const m = await metrics(y);
    assert.equal(m['kvtier_cached_tokens_total{source="remote"}'], b.usage.prompt_tokens - 1);
    assert.equal(m['kvtier_cached_tokens_total{source="disk"}'], 0);
    assert.equal(m.kvtier_prefilled_tokens_total, 1);
    assert.ok(m['kvtier_cache_bytes{tier="remote"}'] > 0);
    assert.match(y.log(), new RegExp(`${b.usage.prompt_tokens - 1} prompt tokens from the remote tier`));
  } finally {
    assert.equal((await stop(x)).code, 0);
    assert.equal((await stop(y)).code, 0);
  }
});

test('--redis to a dead port fails at start with the connection error, the password hidden', async () => {
  const dead = await freePort();
  const r = failedStart(url(PASSWORD, dead));
  assert.notEqual(r.status, 0);
  assert.match(r.log, new RegExp(`--redis redis://:\\*\\*\\*@127\\.0\\.0\\.1:${dead}/serve-test: .*refused`, 'i'));
  assert.ok(!r.log.includes(PASSWORD), r.log);
  assert.doesNotMatch(r.log, /listening on/);
});

test('--redis with a wrong password or a bad URL fails at start with the error', () => {
  let r = failedStart(url('wrong-one'));
  assert.notEqual(r.status, 0);
  assert.match(r.log, /WRONGPASS/, r.log);
  assert.ok(!r.log.includes('wrong-one'), r.log);
  r = failedStart(`http://:${PASSWORD}@127.0.0.1:${port}/`);
  assert.notEqual(r.status, 0);
  assert.match(r.log, /must start with redis:\/\/ or unix:\/\//, r.log);
  assert.ok(!r.log.includes(PASSWORD), r.log);
});
