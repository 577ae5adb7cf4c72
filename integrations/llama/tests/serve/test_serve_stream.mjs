// kvtier-llama serve: streaming as server-sent events, read by the OpenAI SDK and by curl.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { scratch, start, stop, client, curl, chat } from './server.mjs';

let s, srv, api;
before(async () => {
  s = scratch();
  srv = await start(s.model, join(s.dir, 'cache'), ['--slots', '2']);
  api = client(srv);
});
after(async () => {
  if (srv) assert.equal((await stop(srv)).code, 0);
  s.cleanup();
});

const msgs = [{ role: 'user', content: 'Stream me something, please.' }];

test('chat stream: a role chunk, content deltas, the finish, usage; the same text as without', async () => {
  const whole = await api.chat.completions.create(chat(msgs, { max_tokens: 20 }));
  const stream = await api.chat.completions.create(chat(msgs, { max_tokens: 20, stream: true, stream_options: { include_usage: true } }));
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id));
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, whole.choices[0].message.content);
  assert.ok(chunks.length >= 20, `${chunks.length} chunks: the text arrives token by token`);
  const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.deepEqual(fin.map((c) => c.choices[0].finish_reason), ['length']);
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, 20);
  assert.equal(last.usage.prompt_tokens_details.cached_tokens, last.usage.prompt_tokens - 1);
});

test('completion stream with a stop string held back until it is decided', async () => {
  const full = (await api.completions.create({ model: 'chat', prompt: 'xyz', max_tokens: 24, temperature: 0 })).choices[0].text;
  const stopAt = full.slice(10, 13);
  const stream = await api.completions.create({ model: 'chat', prompt: 'xyz', max_tokens: 24, temperature: 0, stop: stopAt, stream: true });
  let text = '';
  const reasons = [];
  for await (const c of stream) {
    assert.equal(c.object, 'text_completion');
    text += c.choices[0].text;
    if (c.choices[0].finish_reason) reasons.push(c.choices[0].finish_reason);
  }
  assert.equal(text, full.slice(0, full.indexOf(stopAt)));
  assert.deepEqual(reasons, ['stop']);
});

test('the raw protocol: text/event-stream, data lines, data: [DONE]', () => {
  const out = curl(srv, '/v1/chat/completions', chat(msgs, { max_tokens: 5, stream: true }));
  assert.equal(out.status, 200);
  const events = out.text.split('\n\n').filter(Boolean);
  assert.ok(events.every((e) => e.startsWith('data: ')), out.text);
  assert.equal(events[events.length - 1], 'data: [DONE]');
  const parsed = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
  assert.equal(parsed.length, 1 + 5 + 1); // role, five tokens, the finish
  assert.equal(parsed[parsed.length - 1].choices[0].finish_reason, 'length');
  const head = JSON.stringify(curl(srv, '/health').body);
  assert.equal(head, '{"status":"ok"}');
});

test('errors before a stream starts are plain JSON errors', () => {
  const r = curl(srv, '/v1/chat/completions', { messages: msgs, stream: true, model: 'other' });
  assert.equal(r.status, 404);
  assert.equal(r.body.error.code, 'model_not_found');
});
