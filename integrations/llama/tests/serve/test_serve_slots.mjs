// kvtier-llama serve: several slots decoded in one batch, requests beyond the slots queued,
// clients that hang up, and SIGTERM while a request runs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { scratch, start, stop, client, metrics, chat } from './server.mjs';

let s, srv, api;
before(async () => {
  s = scratch();
  srv = await start(s.model, join(s.dir, 'cache'), ['--slots', '2', '--ctx', '4096']);
  api = client(srv);
});
after(async () => {
  if (srv) assert.equal((await stop(srv)).code, 0);
  s.cleanup();
});

const convo = (i) => [{ role: 'user', content: `Conversation number ${i}: tell me about ${'abcdefghij'[i]}.` }];

const text = async (r) => {
  if (r.choices) return r.choices[0].message.content;
  let t = ''; // a stream
  for await (const c of r) t += c.choices[0]?.delta?.content ?? '';
  return t;
};

test('five conversations on two slots: batched, queued, each its own greedy text', async () => {
  const len = (i) => (i === 0 ? 440 : 48);
  const alone = [];
  for (let i = 0; i < 5; i++) // one at a time, on a server whose cache holds none of them
    alone.push(await text(await api.chat.completions.create(chat(convo(i), { max_tokens: len(i) }))));
  const m0 = await metrics(srv);
  // the long one first, holding a slot while the four others share the second one
  const long = await api.chat.completions.create(chat(convo(0), { max_tokens: len(0), stream: true }));
  const it = long[Symbol.asyncIterator]();
  let first = '';
  while (!first) first = (await it.next()).value.choices[0]?.delta?.content ?? '';
  const rest = (async () => {
    for (let c = await it.next(); !c.done; c = await it.next()) first += c.value.choices[0]?.delta?.content ?? '';
    return first;
  })();
  const others = [1, 2, 3, 4].map(async (i) =>
    text(await api.chat.completions.create(chat(convo(i), { max_tokens: len(i), stream: i % 2 === 1 }))));
  assert.deepEqual(await Promise.all([rest, ...others]), alone);
  const m1 = await metrics(srv);
  const steps = m1.kvtier_decode_steps_total - m0.kvtier_decode_steps_total;
  const seqs = m1.kvtier_decode_sequences_total - m0.kvtier_decode_sequences_total;
  assert.ok(seqs >= steps + 48, `${seqs} sequences in ${steps} batches: slots decode together`);
  assert.equal(m1.kvtier_slots_busy, 0);
  assert.equal(m1.kvtier_requests_queued, 0);
});

test('a client that hangs up mid-stream frees its slot; what is cached stays right', async () => {
  const msgs = [{ role: 'user', content: 'A long answer, please, that nobody will read.' }];
  const ref = (await api.chat.completions.create(chat(msgs, { max_tokens: 12 }))).choices[0].message.content;
  const m0 = await metrics(srv);
  const stream = await api.chat.completions.create(chat(msgs, { max_tokens: 4000, stream: true }));
  let got = 0;
  for await (const c of stream) {
    if (c.choices[0]?.delta?.content && ++got === 3) break; // leaving the loop aborts the request
  }
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(srv);
    if (m.kvtier_slots_busy === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(m.kvtier_slots_busy, 0, 'the slot was freed');
  const generated = m.kvtier_generated_tokens_total - m0.kvtier_generated_tokens_total;
  assert.ok(generated < 2000, `${generated} of 4000 tokens generated for a client that left`);
  const again = await api.chat.completions.create(chat(msgs, { max_tokens: 12 }));
  assert.equal(again.choices[0].message.content, ref);
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens - 1);
});

test('SIGTERM: the running stream ends normally, the cache is flushed, exit 0', async () => {
  const msgs = [{ role: 'user', content: 'Still talking when the server is told to stop.' }];
  const stream = await api.chat.completions.create(chat(msgs, { max_tokens: 200, stream: true }));
  let text = '', reason = null, signalled = false;
  for await (const c of stream) {
    text += c.choices[0]?.delta?.content ?? '';
    reason = c.choices[0]?.finish_reason ?? reason;
    if (!signalled && text.length >= 2) {
      srv.proc.kill('SIGTERM');
      signalled = true;
    }
  }
  assert.equal(reason, 'length');
  assert.equal(text.length, 200);
  assert.equal((await srv.exited).code, 0);
  assert.match(srv.log(), /stopped, the cache is on disk/);
  srv = await start(s.model, join(s.dir, 'cache'), ['--slots', '2', '--ctx', '4096']);
  const r = await client(srv).chat.completions.create(chat(msgs, { max_tokens: 4 }));
  const m = await metrics(srv);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens - 1);
  assert.equal(m['kvtier_cached_tokens_total{source="disk"}'], r.usage.prompt_tokens - 1);
  assert.equal(r.choices[0].message.content, text.slice(0, 4));
});
