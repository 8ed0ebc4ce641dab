// openai_sdk_rate.cjs — closed-loop callers on the official OpenAI Node SDK, run by
// bench/openai_sdk_rate.py. Usage:
//   node openai_sdk_rate.cjs BASE_URL WORKERS SECONDS RETRIES [TIMEOUT_MS [STOP_EVERY]]
// WORKERS async loops each send one chat at a time for SECONDS; the SDK retries a 429, a 5xx
// or its own timeout RETRIES times with its own backoff (0.5 s doubling, up to 25 % jitter; a
// Retry-After where one comes), each attempt cut after TIMEOUT_MS (the SDK's `timeout`;
// default 30 s). A call that still fails counts as failed, by its status or error class,
// and the loop goes on at once, as an application that drops the request would.
// With STOP_EVERY (>= 0) every chat streams (`stream: true`), its time to first token is
// timed from the call, and, when STOP_EVERY > 0, every STOP_EVERY-th chat of a loop is
// stopped after its third chunk (the SDK aborts it, as a user who presses stop): counted
// as `stopped`, and the rest that end as `ok`. Prints one JSON line at the end.
'use strict';
const OpenAI = require('openai');

const [url, workers, seconds, retries, timeoutMs, stopArg] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-sluice-bench',
                            maxRetries: Number(retries), timeout: Number(timeoutMs) || 30000 });
const messages = [{ role: 'user', content: 'Say hi' }];
const streams = stopArg !== undefined && Number(stopArg) >= 0;
const stopEvery = streams ? Number(stopArg) : 0;
const end = Date.now() + Number(seconds) * 1000;
const tally = { ok: 0, stopped: 0, failed: 0, statuses: {}, latencies_ms: [], ttft_ms: [] };

// One streamed chat: its first chunk's time goes to ttft_ms; `stop`: abort after 3 chunks.
async function stream(t0, stop) {
  const ac = new AbortController();
  const s = await client.chat.completions.create({ model: 'sim', messages, stream: true },
                                                 { signal: ac.signal });
  let chunks = 0;
  try {
    for await (const _ of s) { // eslint-disable-line no-unused-vars
      if (chunks++ === 0)
        tally.ttft_ms.push(Date.now() - t0);
      if (stop && chunks === 3) {
        ac.abort();
        break;
      }
    }
  } catch (e) {
    if (!(stop && e instanceof OpenAI.APIUserAbortError)) throw e;
  }
}

async function loop(i) {
  for (let k = i; Date.now() < end; k++) {
    const t0 = Date.now();
    const stop = stopEvery > 0 && k % stopEvery === 0;
    try {
      if (streams)
        await stream(t0, stop);
      else
        await client.chat.completions.create({ model: 'sim', messages });
      tally[stop ? 'stopped' : 'ok']++;
      tally.latencies_ms.push(Date.now() - t0);
    } catch (e) {
      if (!(e instanceof OpenAI.APIError)) throw e;
      tally.failed++;
      const key = e.status === undefined ? e.constructor.name : String(e.status);
      tally.statuses[key] = (tally.statuses[key] || 0) + 1;
    }
  }
}

const quantile = (l, p) => (l.length ? l[Math.min(l.length - 1, Math.floor(p * l.length))] : null);

Promise.all(Array.from({ length: Number(workers) }, (_, i) => loop(i))).then(() => {
  const l = tally.latencies_ms.sort((a, b) => a - b);
  const f = tally.ttft_ms.sort((a, b) => a - b);
  console.log(JSON.stringify({ ok: tally.ok, stopped: tally.stopped, failed: tally.failed,
                               statuses: tally.statuses, p50_ms: quantile(l, 0.5),
                               p99_ms: quantile(l, 0.99), ttft_p50_ms: quantile(f, 0.5),
                               ttft_p99_ms: quantile(f, 0.99) }));
}, (e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
