// kvtier-llama serve: the OpenAI API through the official SDK and curl, and the prompt cache
// seen from a client (cached_tokens, and the same greedy text with or without the cache).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { existsSync } from 'node:fs';
import { scratch, start, stop, client, curl, metrics, chat } from './server.mjs';

let s, srv, api;
before(async () => {
  s = scratch();
  srv = await start(s.model, join(s.dir, 'cache'), ['--slots', '1']);
  api = client(srv);
});
after(async () => {
  if (srv) assert.equal((await stop(srv)).code, 0);
  s.cleanup();
});

const hello = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello, wörld ✓' }];

test('health and models', async () => {
  assert.deepEqual(curl(srv, '/health').body, { status: 'ok' });
  const models = await api.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['chat']);
});

test('chat completion: OpenAI shape, usage, and the prompt cached on the second call', async () => {
  const a = await api.chat.completions.create(chat(hello));
  assert.equal(a.object, 'chat.completion');
  assert.match(a.id, /^chatcmpl-/);
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(a.choices[0].finish_reason, 'length');
  assert.equal(a.usage.completion_tokens, 24);
  assert.ok(a.usage.prompt_tokens > 30, 'the template wraps the messages');
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + 24);
  assert.equal(a.choices[0].message.content.length, 24, 'greedy text is printable ASCII');
  const b = await api.chat.completions.create(chat(hello));
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, b.usage.prompt_tokens - 1);
});

test('text completion from a string and from token ids', async () => {
  const a = await api.completions.create({ model: 'chat', prompt: 'Once upon', max_tokens: 8, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(a.choices[0].text.length, 8);
  assert.equal(a.usage.prompt_tokens, 1 + 'Once upon'.length); // BOS + one token per byte
  const ids = curl(srv, '/v1/completions', { prompt: [1, 5 + 79, 5 + 110], max_tokens: 3, temperature: 0 });
  assert.equal(ids.status, 200);
  assert.equal(ids.body.usage.prompt_tokens, 3);
  const defaults = curl(srv, '/v1/completions', { prompt: 'x', temperature: 0 });
  assert.equal(defaults.body.usage.completion_tokens, 16, "OpenAI's default max_tokens");
});

test('stop strings end the text before them', async () => {
  const full = (await api.completions.create({ model: 'chat', prompt: 'abc', max_tokens: 20, temperature: 0 }))
    .choices[0].text;
  const stopAt = full.slice(5, 7);
  const cut = full.indexOf(stopAt);
  const r = await api.completions.create({ model: 'chat', prompt: 'abc', max_tokens: 20, temperature: 0, stop: [stopAt, '\u2603'] });
  assert.equal(r.choices[0].text, full.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('sampling: a seed repeats its text, top_k 1 is greedy', async () => {
  const req = { model: 'chat', prompt: 'seeded', max_tokens: 16, temperature: 1.5, seed: 7 };
  const a = await api.completions.create(req);
  const b = await api.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const greedy = await api.completions.create({ ...req, temperature: 0 });
  const k1 = await api.completions.create({ ...req, top_k: 1, seed: 99 });
  assert.equal(k1.choices[0].text, greedy.choices[0].text);
});

test('text is valid UTF-8 when the sampled bytes are not, streamed or not', async () => {
  const prompt = 'héllo ✓ 日本';
  const req = { model: 'chat', prompt, max_tokens: 200, temperature: 2, seed: 3 };
  const r = curl(srv, '/v1/completions', req);
  assert.equal(r.status, 200, r.text); // curl's bytes parsed as JSON: valid UTF-8 throughout
  assert.equal(r.body.usage.prompt_tokens, 1 + Buffer.byteLength(prompt)); // one token per byte
  const t = r.body.choices[0].text;
  assert.ok(t.includes('\uFFFD'), 'stray bytes became U+FFFD');
  assert.ok(/[^\x00-\x7F\uFFFD]/.test(t), 'characters of several bytes came through');
  let streamed = '';
  for await (const c of await api.completions.create({ ...req, stream: true })) streamed += c.choices[0].text;
  assert.equal(streamed, t);
});

test('a conversation taken over by another in the only slot comes back from the RAM tier', async () => {
  const one = [{ role: 'user', content: 'first conversation, which gets evicted from the slot' }];
  const two = [{ role: 'user', content: 'second conversation' }];
  const a = await api.chat.completions.create(chat(one));
  await api.chat.completions.create(chat(two));
  const before = await metrics(srv);
  const next = [...one, a.choices[0].message, { role: 'user', content: 'and again' }];
  const c = await api.chat.completions.create(chat(next));
  const m = await metrics(srv);
  assert.ok(c.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens,
    `cached ${c.usage.prompt_tokens_details.cached_tokens} of the first turn's ${a.usage.prompt_tokens}`);
  assert.equal(m['kvtier_cached_tokens_total{source="ram"}'] - before['kvtier_cached_tokens_total{source="ram"}'],
    c.usage.prompt_tokens_details.cached_tokens);
  // the same turn on a server with an empty cache: the same greedy text
  const fresh = await start(s.model, join(s.dir, 'empty-cache'), ['--slots', '1']);
  try {
    const f = await client(fresh).chat.completions.create(chat(next));
    assert.equal(f.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(c.choices[0].message.content, f.choices[0].message.content);
  } finally {
    assert.equal((await stop(fresh)).code, 0);
  }
});

test('errors: OpenAI-style bodies and statuses', () => {
  const cases = [
    ['/v1/chat/completions', '{"messages": [', 400, 'invalid_json'],
    ['/v1/chat/completions', { model: 'gpt-4o', messages: hello }, 404, 'model_not_found'],
    ['/v1/chat/completions', { messages: [] }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: [{ role: 'user' }], max_tokens: 0 }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: [{ content: 'no role' }] }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: hello, temperature: 'hot' }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: hello, stop: ['a', 'b', 'c', 'd', 'e'] }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: hello, n: 2 }, 400, 'invalid_value'],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x'.repeat(600) }] }, 400, 'context_length_exceeded'],
    ['/v1/completions', { prompt: [1, 99999] }, 400, 'invalid_value'],
    ['/v1/completions', { prompt: '' }, 200, null], // BOS alone
    ['/v1/embeddings', { input: 'x' }, 404, 'not_found'],
  ];
  for (const [path, body, status, code] of cases) {
    const r = curl(srv, path, body);
    assert.equal(r.status, status, `${path} ${JSON.stringify(body)}: ${r.text}`);
    if (code) {
      assert.equal(r.body.error.code, code, r.text);
      assert.equal(typeof r.body.error.message, 'string');
      assert.ok(r.body.error.type);
    }
  }
  assert.equal(curl(srv, '/v1/chat/completions', undefined, 'GET').status, 405);
  const del = curl(srv, '/v1/models', undefined, 'DELETE');
  assert.equal(del.status, 405);
  assert.equal(del.body.error.code, 'method_not_allowed');
  // unknown fields are ignored
  const r = curl(srv, '/v1/chat/completions', { messages: hello, max_tokens: 2, logit_bias: {}, user: 'u', frequency_penalty: 0, tools: [] });
  assert.equal(r.status, 200, r.text);
});

test('the SDK sees errors as APIError with the status', async () => {
  await assert.rejects(api.chat.completions.create({ ...chat(hello), model: 'nope' }),
    (e) => e.status === 404 && /does not exist/.test(e.message));
  await assert.rejects(api.chat.completions.create(chat([{ role: 'user', content: 'y'.repeat(700) }])),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
});

test('--no-cache: every prompt prefilled whole, nothing kept', async () => {
  const off = await start(s.model, join(s.dir, 'never-created'), ['--no-cache', '--slots', '1']);
  try {
    const a = await client(off).chat.completions.create(chat(hello));
    const b = await client(off).chat.completions.create(chat(hello));
    assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(b.choices[0].message.content, a.choices[0].message.content);
    const m = await metrics(off);
    assert.equal(m.kvtier_prefilled_tokens_total, 2 * a.usage.prompt_tokens);
    assert.equal(m['kvtier_cache_entries{tier="ram"}'], 0);
  } finally {
    assert.equal((await stop(off)).code, 0);
  }
  assert.ok(!existsSync(join(s.dir, 'never-created')));
});
