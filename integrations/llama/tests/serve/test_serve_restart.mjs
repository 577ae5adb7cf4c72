// kvtier-llama serve: the prompt cache outlives the process (SIGKILL) and is shared by two
// servers on one directory.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { scratch, start, stop, client, metrics, durable, chat } from './server.mjs';

let s;
before(() => { s = scratch(); });
after(() => s.cleanup());

const turn1 = [
  { role: 'system', content: 'You answer questions about caches.' },
  { role: 'user', content: 'What does a prompt cache keep between turns of a conversation?' },
];
const turn2 = (reply) => [...turn1, { role: 'assistant', content: reply }, { role: 'user', content: 'And after a restart?' }];

test('SIGKILL and restart: the next turn is served from disk and continues as if never stopped', async () => {
  // the uninterrupted server
  const ref = await start(s.model, join(s.dir, 'ref-cache'));
  const r1 = await client(ref).chat.completions.create(chat(turn1, { max_tokens: 32 }));
  const r2 = await client(ref).chat.completions.create(chat(turn2(r1.choices[0].message.content), { max_tokens: 32 }));
  assert.equal((await stop(ref)).code, 0);

  const dir = join(s.dir, 'cache');
  let srv = await start(s.model, dir);
  const a1 = await client(srv).chat.completions.create(chat(turn1, { max_tokens: 32 }));
  assert.equal(a1.choices[0].message.content, r1.choices[0].message.content);
  await durable(srv);
  assert.equal((await stop(srv, 'SIGKILL')).signal, 'SIGKILL');

  srv = await start(s.model, dir);
  try {
    const a2 = await client(srv).chat.completions.create(chat(turn2(a1.choices[0].message.content), { max_tokens: 32 }));
    const m = await metrics(srv);
    assert.equal(a2.choices[0].message.content, r2.choices[0].message.content);
    assert.equal(a2.usage.prompt_tokens, r2.usage.prompt_tokens);
    // the first turn's prompt and reply came from disk (the reply's last token was never
    // decoded, and its text may re-tokenize differently at the edge)
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens,
      `cached ${a2.usage.prompt_tokens_details.cached_tokens}, first turn's prompt ${a1.usage.prompt_tokens}`);
    assert.equal(m['kvtier_cached_tokens_total{source="disk"}'], a2.usage.prompt_tokens_details.cached_tokens);
    assert.equal(m.kvtier_prefilled_tokens_total, a2.usage.prompt_tokens - a2.usage.prompt_tokens_details.cached_tokens);
  } finally {
    assert.equal((await stop(srv)).code, 0);
  }
});

test('two servers on one directory: a prefix computed by one is served by the other', async () => {
  const dir = join(s.dir, 'shared'); // their slot counts differ: not part of the identity
  const [x, y] = await Promise.all([start(s.model, dir, ['--slots', '1']), start(s.model, dir, ['--slots', '3'])]);
  try {
    const msgs = [{ role: 'user', content: 'Computed by the first server, '.repeat(6) }];
    const a = await client(x).chat.completions.create(chat(msgs, { max_tokens: 8 }));
    assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
    await durable(x);
    const b = await client(y).chat.completions.create(chat(msgs, { max_tokens: 8 }));
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
    assert.equal((await metrics(y))['kvtier_cached_tokens_total{source="disk"}'], b.usage.prompt_tokens - 1);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  } finally {
    assert.equal((await stop(x)).code, 0);
    assert.equal((await stop(y)).code, 0);
  }
});
