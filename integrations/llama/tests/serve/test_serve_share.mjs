// kvtier-llama serve shares prefixes by default: two conversations that branch off one long
// system prompt store that prompt once on disk (`kvtier stats`), and after a restart each
// branch continues from disk with the same greedy text as a server that never cached anything.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { readdirSync, statSync } from 'node:fs';
import { scratch, start, stop, client, metrics, durable, stats, chat } from './server.mjs';

let s;
before(() => { s = scratch(); });
after(() => s.cleanup());

// About 620 tokens of the byte vocabulary: two 256-token chunks and some of a third.
const system = 'You are the help desk of a library that keeps the prompts of language models on disk. '
  .repeat(7);
const ask = ['How much disk does one conversation take?', 'Which files does a restart read?'];
const turn1 = (q) => [{ role: 'system', content: system }, { role: 'user', content: q }];
const turn2 = (q, reply) => [...turn1(q), { role: 'assistant', content: reply }, { role: 'user', content: 'Why?' }];
const opts = ['--ctx', '1024', '--slots', '2'];
const CHUNK = 256; // tokens per shared chunk (docs/SHARING.md)

// The files of a cache directory, with their sizes.
function filesUnder(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile())
    .map((e) => ({ name: e.name, size: statSync(join(e.path, e.name)).size }));
}

// Both branches' first turns, then both second turns: { first, second } of responses.
async function conversations(srv, firstOnly = false) {
  const api = client(srv);
  const first = [];
  for (const q of ask) first.push(await api.chat.completions.create(chat(turn1(q), { max_tokens: 16 })));
  if (firstOnly) return { first };
  const second = [];
  for (const [i, q] of ask.entries())
    second.push(await api.chat.completions.create(chat(turn2(q, first[i].choices[0].message.content), { max_tokens: 16 })));
  return { first, second };
}

test('two branches off one long prompt: stored once, each restored from disk after a restart', async () => {
  const ref = await start(s.model, join(s.dir, 'unused'), ['--no-cache', ...opts]);
  const want = await conversations(ref);
  assert.equal((await stop(ref)).code, 0);

  // The same first turns on a server that stores whole entries and on one that shares.
  const whole = join(s.dir, 'whole'), shared = join(s.dir, 'shared');
  for (const [dir, extra] of [[whole, ['--no-share-prefixes']], [shared, []]]) {
    const srv = await start(s.model, dir, [...opts, ...extra]);
    const got = await conversations(srv, true);
    for (const [i, r] of got.first.entries())
      assert.equal(r.choices[0].message.content, want.first[i].choices[0].message.content);
    await durable(srv, 2);
    assert.equal((await stop(srv, 'SIGKILL')).signal, 'SIGKILL');
  }

  // Each entry holds its prompt and reply less the last sampled token; the chunks before its
  // last token are cut, and the branches' common system prompt covers them all.
  const n = want.first.map((r) => r.usage.prompt_tokens + r.usage.completion_tokens - 1);
  const chunks = Math.floor((n[0] - 1) / CHUNK);
  assert.ok(chunks >= 2, `entries of ${n} tokens`);
  assert.equal(Math.floor((n[1] - 1) / CHUNK), chunks);
  const w = stats(whole), sh = stats(shared);
  assert.equal(w.entries, 2);
  assert.equal(w.shared_chunks, 0);
  assert.ok(filesUnder(whole).every((f) => f.name.endsWith('.mlxkv')), 'whole entries only');
  assert.equal(sh.entries, 2);
  assert.equal(sh.shared_chunks, chunks, 'the two branches need the same chunks, stored once');
  // On disk: two tails and one copy of each chunk, which total_bytes counts once.
  const files = filesUnder(shared);
  const chunkFiles = files.filter((f) => f.name.endsWith('.kvchunk'));
  assert.equal(files.filter((f) => f.name.endsWith('.kvshare')).length, 2);
  assert.equal(chunkFiles.length, chunks);
  assert.equal(sh.shared_bytes, chunkFiles.reduce((t, f) => t + f.size, 0));
  assert.equal(sh.total_bytes, files.reduce((t, f) => t + f.size, 0));
  assert.ok(sh.total_bytes < w.total_bytes, `shared ${sh.total_bytes} B, whole ${w.total_bytes} B`);

  const srv = await start(s.model, shared, opts);
  try {
    const api = client(srv);
    let fromDisk = 0;
    for (const [i, q] of ask.entries()) {
      const r = await api.chat.completions.create(chat(turn2(q, want.first[i].choices[0].message.content), { max_tokens: 16 }));
      assert.equal(r.choices[0].message.content, want.second[i].choices[0].message.content);
      assert.ok(r.usage.prompt_tokens_details.cached_tokens >= want.first[i].usage.prompt_tokens,
        `branch ${i}: cached ${r.usage.prompt_tokens_details.cached_tokens} of ${r.usage.prompt_tokens}`);
      fromDisk += r.usage.prompt_tokens_details.cached_tokens;
    }
    assert.equal((await metrics(srv))['kvtier_cached_tokens_total{source="disk"}'], fromDisk);
  } finally {
    assert.equal((await stop(srv)).code, 0);
  }
});
