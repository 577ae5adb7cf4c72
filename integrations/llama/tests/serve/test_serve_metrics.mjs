// kvtier-llama serve: /metrics in Prometheus' text format, its counters following requests.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { scratch, start, stop, client, metrics, durable, chat } from './server.mjs';

let s, srv;
before(async () => {
  s = scratch();
  srv = await start(s.model, join(s.dir, 'cache'), ['--slots', '1']);
});
after(async () => {
  if (srv) assert.equal((await stop(srv)).code, 0);
  s.cleanup();
});

test('the text format: HELP and TYPE before each family, one sample per line', async () => {
  const res = await fetch(srv.url + '/metrics');
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const lines = (await res.text()).trim().split('\n');
  const typed = new Set();
  for (const l of lines) {
    const t = /^# TYPE (kvtier_\w+) (counter|gauge|histogram)$/.exec(l);
    if (t) typed.add(t[1]);
    else if (!l.startsWith('# HELP ')) {
      const m = /^(kvtier_\w+?)(_bucket|_sum|_count)?(\{[^}]*\})? -?[0-9.e+]+$/.exec(l);
      assert.ok(m, `not a sample: ${l}`);
      assert.ok(typed.has(m[1]) || typed.has(m[1] + (m[2] ?? '')), `no TYPE before ${l}`);
    }
  }
  for (const f of ['requests_total', 'prompt_tokens_total', 'cached_tokens_total', 'prefilled_tokens_total',
    'time_to_first_token_seconds', 'cache_bytes'])
    assert.ok(typed.has('kvtier_' + f), f);
});

test('counters: requests, prompt tokens by where they came from, TTFT, bytes per tier', async () => {
  const api = client(srv);
  const m0 = await metrics(srv);
  const msgs = [{ role: 'user', content: 'Count me in the metrics.' }];
  const a = await api.chat.completions.create(chat(msgs, { max_tokens: 6 }));
  const b = await api.chat.completions.create(chat(msgs, { max_tokens: 6 })); // the slot's own
  // shares only the BOS token with the conversation in the slot, which it takes over
  await api.completions.create({ model: 'chat', prompt: 'other', max_tokens: 2, temperature: 0 });
  const c = await api.chat.completions.create(chat(msgs, { max_tokens: 6 })); // from RAM
  const m = await durable(srv, 1);
  const d = (k) => m[k] - (m0[k] ?? 0);
  assert.equal(d('kvtier_requests_total{endpoint="chat"}'), 3);
  assert.equal(d('kvtier_requests_total{endpoint="completions"}'), 1);
  const n = a.usage.prompt_tokens;
  assert.equal(d('kvtier_prompt_tokens_total'), 3 * n + 6);
  assert.equal(d('kvtier_cached_tokens_total{source="slot"}'), b.usage.prompt_tokens_details.cached_tokens + 1);
  assert.equal(d('kvtier_cached_tokens_total{source="ram"}'), c.usage.prompt_tokens_details.cached_tokens);
  assert.equal(c.usage.prompt_tokens_details.cached_tokens, n - 1);
  assert.equal(d('kvtier_prefilled_tokens_total'), n + 1 + 5 + 1);
  assert.equal(d('kvtier_generated_tokens_total'), 20);
  assert.equal(d('kvtier_time_to_first_token_seconds_count'), 4);
  assert.equal(d('kvtier_time_to_first_token_seconds_bucket{le="+Inf"}'), 4);
  assert.ok(d('kvtier_time_to_first_token_seconds_sum') > 0);
  assert.ok(m['kvtier_cache_bytes{tier="ram"}'] > 0);
  assert.ok(m['kvtier_cache_bytes{tier="disk"}'] > 0);
  assert.equal(m.kvtier_pending_writes, 0);
  const bad = await fetch(srv.url + '/v1/completions', { method: 'POST', body: '{' });
  assert.equal(bad.status, 400);
  assert.equal((await metrics(srv)).kvtier_request_errors_total, (m.kvtier_request_errors_total ?? 0) + 1);
});
