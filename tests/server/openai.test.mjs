// kvq serve driven by a client nobody here wrote: the official OpenAI SDK for Node.js (npm package `openai`, pinned
// in package.json / package-lock.json, installed by `npm ci` from ctest). On loopback, every wait bounded:
//   - greedy (temperature 0) completions equal `kvq run --temp 0` for the same prompt, streaming and not, with the
//     bf16 cache and with int2 (small windows, so that the prompt reaches the quantized region);
//   - chat, streaming and not; the model list; errors as the SDK's typed errors (400, 401, 404);
//   - a --kv-budget-gib too small for the running requests: preemptions, and the replies of requests served alone;
//   - SIGTERM drains: a stream in flight finishes, a new request gets 503, the process exits 0.
//   - the fields clients send (n, penalties, min_p, logit_bias, per-choice seeds), --lenient-fields, prefix caching's
//     usage.prompt_tokens_details.cached_tokens; with --test-hooks a failing step, an aborted request, a lost device;
//   - 200 idle and 120 trickling connections: an SDK request with a 1 s timeout is answered, no thread is started for
//     them and they are closed at their deadlines; --queue-timeout (503) and --request-timeout (504);
//   - greedy decoding with presence / frequency penalties against a reference built from the reported raw logprobs.
// Run: KVQ=build/kvq node --test tests/server/openai.test.mjs   (from the repository root)
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import OpenAI from 'openai';

const KVQ = process.env.KVQ ?? 'build/kvq';
const MODEL = 'models/ref';
const CTX = '1024';
const servers = [];

// Starts `kvq serve` on a free port (--port 0) and resolves once its log names the port.
function startServer(args) {
  return new Promise((resolve, reject) => {
    const ctx = args.includes('-c') ? [] : ['-c', CTX];
    const proc = spawn(KVQ, ['serve', '-m', MODEL, '--port', '0', ...ctx, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`kvq serve did not start in 60 s:\n${log}`)), 60_000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.port) {
        clearTimeout(timer);
        proc.port = Number(m[1]);
        proc.log = () => log;
        servers.push(proc);
        resolve(proc);
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); if (!proc.port) reject(new Error(`kvq serve exited ${code}:\n${log}`)); });
  });
}

function exited(proc) {
  return new Promise((resolve, reject) => {
    if (proc.exitCode !== null) return resolve(proc.exitCode);
    const timer = setTimeout(() => reject(new Error('kvq serve did not exit in 60 s')), 60_000);
    proc.on('exit', (code) => { clearTimeout(timer); resolve(code); });
  });
}

after(() => { for (const p of servers) if (p.exitCode === null) p.kill('SIGKILL'); });

function client(proc, apiKey = 'none') {
  return new OpenAI({ baseURL: `http://127.0.0.1:${proc.port}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
}

// `kvq run` prints the prompt, the generated text and a newline.
function kvqRun(prompt, n, cacheArgs) {
  const out = execFileSync(KVQ, ['run', '-m', MODEL, '-c', CTX, '-p', prompt, '-n', String(n), '--temp', '0', ...cacheArgs],
                           { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 120_000 });
  assert.ok(out.startsWith(prompt) && out.endsWith('\n'), `kvq run output: ${JSON.stringify(out)}`);
  return out.slice(prompt.length, -1);
}

const PROMPT = 'The page cache keeps recently used file data in memory, so that a later read of the same blocks ' +
  'does not have to wait for the disk. When memory runs short, the kernel writes dirty pages back and reclaims ' +
  'the least recently used ones first. Applications that stream large files can tell the kernel';

const caches = {
  bf16: [],
  int2: ['-ctk', 'int2', '-ctv', 'int2', '--kv-sink', '4', '--kv-recent', '16'],
};

for (const [name, cacheArgs] of Object.entries(caches)) {
  test(`greedy completions equal kvq run --temp 0 (${name}), streaming and not`, { timeout: 300_000 }, async () => {
    const server = await startServer(cacheArgs);
    const api = client(server);
    const want = kvqRun(PROMPT, 24, cacheArgs);
    assert.ok(want.length > 0);
    const whole = await api.completions.create({ model: 'ref', prompt: PROMPT, max_tokens: 24, temperature: 0 });
    assert.equal(whole.object, 'text_completion');
    assert.equal(whole.choices[0].text, want);
    assert.equal(whole.usage.completion_tokens <= 24, true);
    assert.equal(whole.usage.prompt_tokens > 16 + 4, true);  // past the windows: the int2 region is read
    let streamed = '';
    let finish = null;
    const stream = await api.completions.create({ model: 'ref', prompt: PROMPT, max_tokens: 24, temperature: 0, stream: true });
    for await (const chunk of stream) {
      streamed += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(streamed, want);
    assert.equal(finish, whole.choices[0].finish_reason);
    server.kill('SIGTERM');
    assert.equal(await exited(server), 0);
  });
}

test('chat, the model list and typed errors through the SDK', { timeout: 300_000 }, async () => {
  const server = await startServer(['--api-key', 'sekret']);
  const api = client(server, 'sekret');
  const models = await api.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['ref']);

  const messages = [{ role: 'system', content: 'You answer briefly.' }, { role: 'user', content: 'What does a kernel do?' }];
  const reply = await api.chat.completions.create({ model: 'ref', messages, max_tokens: 12, temperature: 0 });
  assert.equal(reply.object, 'chat.completion');
  assert.equal(reply.choices[0].message.role, 'assistant');
  assert.equal(typeof reply.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(reply.choices[0].finish_reason));
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + reply.usage.completion_tokens);
  let content = '';
  let role = null;
  let usage = null;
  const stream = await api.chat.completions.create({ model: 'ref', messages, max_tokens: 12, temperature: 0, stream: true,
                                                     stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    role = chunk.choices[0]?.delta?.role ?? role;
    content += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(role, 'assistant');
  assert.equal(content, reply.choices[0].message.content);
  assert.deepEqual(usage, reply.usage);

  // Seeded sampling is reproducible.
  const a = await api.completions.create({ model: 'ref', prompt: 'The', max_tokens: 8, temperature: 0.9, seed: 17 });
  const b = await api.completions.create({ model: 'ref', prompt: 'The', max_tokens: 8, temperature: 0.9, seed: 17 });
  assert.equal(a.choices[0].text, b.choices[0].text);

  await assert.rejects(api.completions.create({ model: 'ref', prompt: 'x', max_tokens: 5000 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.code, 'context_length_exceeded');
    assert.equal(e.param, 'max_tokens');
    return true;
  });
  await assert.rejects(api.completions.create({ model: 'gpt-4', prompt: 'x' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.code, 'model_not_found');
    return true;
  });
  await assert.rejects(client(server, 'wrong').models.list(), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError);
    assert.equal(e.code, 'invalid_api_key');
    return true;
  });
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});

test('a --kv-budget-gib too small for the running requests preempts, and every reply equals the one served alone',
     { timeout: 300_000 }, async () => {
  // Windows of 4 slots (sinks 4, recent 8, chunks of 16) and 16 pages of 8 tokens: one sequence of the 128-token
  // context fits, four growing ones do not.
  const server = await startServer(['-c', '128', '-np', '4', '--kv-sink', '4', '--kv-recent', '8', '--kv-page', '8',
                                    '-b', '16', '--kv-budget-gib', '0.0019']);
  const api = client(server);
  const prompts = [0, 1, 2, 3].map((k) => Array.from({ length: 36 + 4 * k }, (_, i) => 1 + ((i * 7919 + k * 104729) % 8000)));
  const ask = (prompt) => api.completions.create({ model: 'ref', prompt, max_tokens: 48, temperature: 0, ignore_eos: true });
  const alone = [];
  for (const p of prompts) alone.push(await ask(p));
  const metric = async (name) => {
    const text = await (await fetch(`http://127.0.0.1:${server.port}/metrics`)).text();
    return Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))[1]);
  };
  assert.equal(await metric('kvq_preemptions_total'), 0);
  const together = await Promise.all(prompts.map(ask));
  assert.ok(await metric('kvq_preemptions_total') > 0, 'no preemption: the pool was not too small');
  for (let k = 0; k < prompts.length; ++k) {
    assert.equal(together[k].usage.completion_tokens, 48);
    assert.equal(together[k].choices[0].text, alone[k].choices[0].text, `request ${k}`);
  }
  let used = -1;  // the gauges are published after the engine's step
  for (let i = 0; i < 500 && used !== 0; ++i) {
    used = await metric('kvq_kv_pages_used');
    if (used !== 0) await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(used, 0);
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});

test('SIGTERM drains: the stream in flight finishes, a new request gets 503, then the process exits 0',
     { timeout: 300_000 }, async () => {
  const server = await startServer([]);
  const api = client(server);
  const stream = await api.completions.create({ model: 'ref', prompt: 'The kernel', max_tokens: 120, temperature: 0,
                                                stream: true, stream_options: { include_usage: true }, ignore_eos: true });
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  server.kill('SIGTERM');
  // Draining once /health says so (120 tokens take far longer than the signal).
  const base = `http://127.0.0.1:${server.port}`;
  let draining = false;
  for (let i = 0; i < 1500 && !draining; ++i) {
    draining = (await fetch(`${base}/health`)).status === 503;
    if (!draining) await new Promise((r) => setTimeout(r, 20));
  }
  assert.ok(draining, '/health did not turn 503 after SIGTERM');
  await assert.rejects(api.completions.create({ model: 'ref', prompt: 'x', max_tokens: 1 }), (e) => {
    assert.ok(e instanceof OpenAI.InternalServerError || e.status === 503, String(e));
    assert.equal(e.status, 503);
    assert.equal(e.code, 'shutting_down');
    return true;
  });
  let usage = null;
  for (let next = await it.next(); !next.done; next = await it.next()) if (next.value.usage) usage = next.value.usage;
  assert.equal(usage.completion_tokens, 120);
  assert.equal(await exited(server), 0);
  assert.match(server.log(), /SIGTERM: draining/);
});

test('a step that throws gets a 500 and the server goes on; a client that aborts is cancelled; a lost device turns '
     + '/health to 503', { timeout: 300_000 }, async () => {
  // POST /debug/fault arms a fault in the next engine step. A context of 4096 gives the request that the client abandons
  // seconds of tokens to run: its cancellation is not a race with its own end on a loaded machine.
  const server = await startServer(['--test-hooks', '-c', '4096']);
  const api = client(server);
  const base = `http://127.0.0.1:${server.port}`;
  const arm = (fault) => fetch(`${base}/debug/fault`, { method: 'POST', body: JSON.stringify({ fault }) });
  const metric = async (name) => {
    const text = await (await fetch(`${base}/metrics`)).text();
    return Number(text.match(new RegExp(`^${name.replace(/[{}"]/g, '\\$&')} (\\S+)$`, 'm'))[1]);
  };
  const until = async (pred) => {
    for (let i = 0; i < 1500; ++i) { if (await pred()) return true; await new Promise((r) => setTimeout(r, 20)); }
    return false;
  };
  const ask = { model: 'ref', prompt: 'The kernel', max_tokens: 4, temperature: 0 };
  const want = await api.completions.create(ask);

  assert.equal((await arm('bad_alloc')).status, 200);
  await assert.rejects(api.completions.create(ask), (e) => {
    assert.ok(e instanceof OpenAI.InternalServerError, String(e));
    assert.equal(e.status, 500);
    assert.equal(e.code, 'internal_error');
    return true;
  });
  const again = await api.completions.create(ask);
  assert.equal(again.choices[0].text, want.choices[0].text);
  assert.equal((await fetch(`${base}/health`)).status, 200);

  // A non-streaming client that gives up: its request is cancelled, far from its 4000 tokens.
  const ac = new AbortController();
  const tokens = await metric('kvq_generation_tokens_total');
  const long = api.completions.create({ ...ask, max_tokens: 4000, ignore_eos: true }, { signal: ac.signal });
  // Its own tokens, not a running count the previous request may have left: the abort reaches a running request.
  assert.ok(await until(async () => (await metric('kvq_generation_tokens_total')) > tokens));
  assert.ok(await until(async () => (await metric('kvq_requests_running')) === 1));
  ac.abort();
  await assert.rejects(long, (e) => e instanceof OpenAI.APIUserAbortError);
  assert.ok(await until(async () => (await metric('kvq_requests_finished_total{reason="cancelled"}')) === 1));
  assert.equal(await metric('kvq_requests_running'), 0);
  assert.ok((await metric('kvq_generation_tokens_total')) < tokens + 4000);

  assert.equal((await arm('device_lost')).status, 200);
  await assert.rejects(api.completions.create(ask), (e) => e.status === 503 && e.code === 'device_lost');
  const health = await fetch(`${base}/health`);
  assert.equal(health.status, 503);
  assert.equal((await health.json()).error.code, 'device_lost');
  await assert.rejects(api.completions.create(ask), (e) => {
    assert.equal(e.status, 503);
    assert.equal(e.code, 'device_lost');
    return true;
  });
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});

test('the fields clients send: n, presence / frequency / repetition penalties, min_p, logit_bias, seed per choice; '
     + '--lenient-fields ignores vLLM\'s extra fields', { timeout: 300_000 }, async () => {
  const server = await startServer(['--lenient-fields', '-b', '32']);  // chunks of 32: prompts reach the prefix cache
  const api = client(server);
  // Two chats sharing a long system prompt: the second continues from the first's cached prefix (a chunk boundary).
  const chat = (q) => api.chat.completions.create({ model: 'ref', max_tokens: 4, temperature: 0,
    messages: [{ role: 'system', content: PROMPT }, { role: 'user', content: q }] });
  const c1 = await chat('What is it?');
  const c2 = await chat('Why?');
  assert.equal(c1.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(c2.usage.prompt_tokens_details.cached_tokens >= 32, JSON.stringify(c2.usage));
  assert.equal(c2.usage.prompt_tokens_details.cached_tokens % 32, 0);
  const ask = { model: 'ref', prompt: 'The kernel', max_tokens: 6, temperature: 0.9, presence_penalty: 0.6,
                frequency_penalty: 0.3, repetition_penalty: 1.2, min_p: 0.05, ignore_eos: true };
  const two = await api.completions.create({ ...ask, n: 2, seed: 11 });
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.equal(two.usage.completion_tokens, 12);
  const first = await api.completions.create({ ...ask, seed: 11 });
  const second = await api.completions.create({ ...ask, seed: 12 });  // choice i is seeded seed + i
  assert.equal(two.choices[0].text, first.choices[0].text);
  assert.equal(two.choices[1].text, second.choices[0].text);
  // logit_bias: +100 on one token makes greedy decoding repeat it, in every choice.
  const steered = await api.completions.create({ model: 'ref', prompt: 'The kernel', max_tokens: 3, temperature: 0,
                                                 ignore_eos: true, logprobs: 0, n: 2, logit_bias: { 100: 100 } });
  assert.equal(steered.choices.length, 2);
  for (const c of steered.choices) {
    const t = c.logprobs.tokens;
    assert.equal(t.length, 3);
    assert.ok(t[0] === t[1] && t[1] === t[2], JSON.stringify(t));
    assert.equal(c.text, t.join(''));
  }
  const plain = await api.completions.create({ model: 'ref', prompt: 'The kernel', max_tokens: 3, temperature: 0,
                                               ignore_eos: true, logprobs: 0 });
  assert.notDeepEqual(plain.choices[0].logprobs.tokens, steered.choices[0].logprobs.tokens);
  // A vLLM extra_body field: ignored (logged once) with --lenient-fields.
  const lenient = await api.completions.create({ ...ask, seed: 11, skip_special_tokens: true,
                                                 spaces_between_special_tokens: false });
  assert.equal(lenient.choices[0].text, first.choices[0].text);
  await api.completions.create({ ...ask, skip_special_tokens: true });
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
  assert.equal(server.log().split("ignoring the unknown request field 'skip_special_tokens'").length - 1, 1);
});

// The threads of a process: the Threads line of /proc/PID/status.
function threadsOf(proc) {
  return Number(readFileSync(`/proc/${proc.pid}/status`, 'utf8').match(/^Threads:\s+(\d+)$/m)[1]);
}

// A raw TCP connection to the server: its 'close' event resolves `gone`.
function rawSocket(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', () => {});  // a reset at the server's deadline is a close
    s.once('error', reject);
    s.gone = new Promise((r) => s.on('close', () => r(true)));
  });
}

function within(promise, ms) {
  return Promise.race([promise, new Promise((r) => setTimeout(() => r(false), ms))]);
}

test('200 idle and 120 trickling connections: an SDK request with a 1 s timeout is answered, the server starts no '
     + 'thread for them and closes them at their deadlines', { timeout: 300_000 }, async () => {
  const server = await startServer(['-c', '64', '--idle-timeout', '2', '--header-timeout', '3', '--http-threads', '2',
                                    '--workers', '2']);
  const ask = { model: 'ref', prompt: 'The kernel', max_tokens: 4, temperature: 0, ignore_eos: true };
  const want = await client(server).completions.create(ask);
  const threads = threadsOf(server);  // after a first request: every thread the server runs
  const idle = await Promise.all(Array.from({ length: 200 }, () => rawSocket(server.port)));
  const trickle = await Promise.all(Array.from({ length: 120 }, () => rawSocket(server.port)));
  // A slowloris: one header byte per connection every 200 ms, far longer than the header deadline.
  const slow = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: ' + 'a'.repeat(400);
  let at = 0;
  const timer = setInterval(() => {
    for (const s of trickle) if (!s.destroyed) s.write(slow[at]);
    at = Math.min(at + 1, slow.length - 1);
  }, 200);
  try {
    await new Promise((r) => setTimeout(r, 600));  // every trickling connection has sent a few bytes
    const api = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'none', maxRetries: 0,
                             timeout: 1000 });
    const got = await api.completions.create(ask);
    assert.equal(got.choices[0].text, want.choices[0].text);
    assert.equal(got.usage.completion_tokens, 4);
    assert.equal(threadsOf(server), threads);
    const metrics = await (await fetch(`http://127.0.0.1:${server.port}/metrics`)).text();
    assert.ok(Number(metrics.match(/^kvq_http_connections (\S+)$/m)[1]) >= 320, 'the connections are open');
    for (const s of trickle) assert.equal(await within(s.gone, 30_000), true, 'a trickling connection stayed open');
    for (const s of idle) assert.equal(await within(s.gone, 30_000), true, 'an idle connection stayed open');
    assert.equal(threadsOf(server), threads);
  } finally {
    clearInterval(timer);
    for (const s of [...idle, ...trickle]) s.destroy();
  }
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});

test('a request past --queue-timeout gets 503 queue_timeout and one past --request-timeout 504 request_timeout, '
     + 'through the SDK', { timeout: 300_000 }, async () => {
  const long = { model: 'ref', prompt: 'The kernel', max_tokens: 900, temperature: 0, ignore_eos: true };
  const metric = async (server, name) => {
    const text = await (await fetch(`http://127.0.0.1:${server.port}/metrics`)).text();
    return Number(text.match(new RegExp(`^${name.replace(/[{}"]/g, '\\$&')} (\\S+)$`, 'm'))[1]);
  };
  {
    const server = await startServer(['-np', '1', '--queue-timeout', '0.3']);
    const api = client(server);
    const ac = new AbortController();
    const running = await api.completions.create({ ...long, stream: true }, { signal: ac.signal });
    const it = running[Symbol.asyncIterator]();
    assert.equal((await it.next()).done, false);  // it holds the one sequence slot
    await assert.rejects(api.completions.create({ ...long, max_tokens: 4 }), (e) => {
      assert.ok(e instanceof OpenAI.InternalServerError, String(e));
      assert.equal(e.status, 503);
      assert.equal(e.code, 'queue_timeout');
      return true;
    });
    assert.equal(await metric(server, 'kvq_requests_finished_total{reason="queue_timeout"}'), 1);
    ac.abort();  // the SDK ends an aborted stream (after the events it had decoded already); the server cancels it
    let ended = false;
    for (let i = 0; i < 100 && !ended; ++i) ended = (await it.next()).done;  // far fewer than the 900 tokens asked
    assert.ok(ended);
    let cancelled = 0;
    for (let i = 0; i < 1500 && cancelled !== 1; ++i) {
      cancelled = await metric(server, 'kvq_requests_finished_total{reason="cancelled"}');
      if (cancelled !== 1) await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(cancelled, 1);
    server.kill('SIGTERM');
    assert.equal(await exited(server), 0);
  }
  const server = await startServer(['--request-timeout', '0.2']);  // 900 tokens take far longer on the CPU
  const api = client(server);
  await assert.rejects(api.completions.create(long), (e) => {
    assert.ok(e instanceof OpenAI.InternalServerError, String(e));
    assert.equal(e.status, 504);
    assert.equal(e.code, 'request_timeout');
    return true;
  });
  // Streaming: the SDK throws the error event that ends the stream.
  const stream = await api.completions.create({ ...long, stream: true });
  await assert.rejects((async () => { for await (const chunk of stream) assert.ok(chunk); })(), (e) => {
    assert.ok(e instanceof OpenAI.APIError, String(e));
    assert.equal(e.code, 'request_timeout');
    return true;
  });
  assert.equal(await metric(server, 'kvq_requests_finished_total{reason="deadline"}'), 2);
  assert.ok((await metric(server, 'kvq_generation_tokens_total')) < 1800);
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});

test('greedy decoding with presence and frequency penalties picks, at every step, the largest of the step\'s raw '
     + 'logprobs less the penalties of the tokens generated so far', { timeout: 300_000 }, async () => {
  const server = await startServer([]);
  const api = client(server);
  const ask = { model: 'ref', prompt: 'The kernel', max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 20 };
  const presence = 0.7, frequency = 0.4;
  const plain = (await api.completions.create(ask)).choices[0].logprobs;
  const got = (await api.completions.create({ ...ask, presence_penalty: presence, frequency_penalty: frequency }))
    .choices[0].logprobs;
  assert.equal(got.tokens.length, 12);
  assert.notDeepEqual(got.tokens, plain.tokens, 'the penalties changed nothing: no test');
  // The reference: the reported logprobs are the model's (before penalties); the penalised argmax is among the raw
  // top 20, since at most 12 tokens are penalised.
  const count = new Map();
  for (let k = 0; k < got.tokens.length; ++k) {
    const top = Object.entries(got.top_logprobs[k]);
    assert.equal(top.length, 20, `step ${k}: 20 distinct top tokens`);
    const score = ([t, lp]) => lp - (count.has(t) ? presence + frequency * count.get(t) : 0);
    const best = top.reduce((a, b) => (score(b) > score(a) ? b : a));
    assert.equal(got.tokens[k], best[0], `step ${k}: ${JSON.stringify(top.map((e) => [e[0], score(e)]))}`);
    count.set(got.tokens[k], (count.get(got.tokens[k]) ?? 0) + 1);
  }
  server.kill('SIGTERM');
  assert.equal(await exited(server), 0);
});
