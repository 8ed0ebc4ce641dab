// openai_sdk_rate.cjs — closed-loop callers on the official OpenAI Node SDK, run by
// bench/openai_sdk_rate.py. Usage:
//   node openai_sdk_rate.cjs BASE_URL WORKERS SECONDS RETRIES [TIMEOUT_MS]
// WORKERS async loops each send one chat at a time for SECONDS; the SDK retries a 429, a 5xx
// or its own timeout RETRIES times with its own backoff (0.5 s doubling, up to 25 % jitter; a
// Retry-After where one comes), each attempt cut after TIMEOUT_MS (the SDK's `timeout`;
// default 30 s). A call that still fails counts as failed, by its status or error class,
// and the loop goes on at once, as an application that drops the request would. Prints one
// JSON line at the end.
'use strict';
const OpenAI = require('openai');

const [url, workers, seconds, retries, timeoutMs] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-sluice-bench',
                            maxRetries: Number(retries), timeout: Number(timeoutMs) || 30000 });
const messages = [{ role: 'user', content: 'Say hi' }];
const end = Date.now() + Number(seconds) * 1000;
const tally = { ok: 0, failed: 0, statuses: {}, latencies_ms: [] };

async function loop() {
  while (Date.now() < end) {
    const t0 = Date.now();
    try {
      await client.chat.completions.create({ model: 'sim', messages });
      tally.ok++;
      tally.latencies_ms.push(Date.now() - t0);
    } catch (e) {
      if (!(e instanceof OpenAI.APIError)) throw e;
      tally.failed++;
      const key = e.status === undefined ? e.constructor.name : String(e.status);
      tally.statuses[key] = (tally.statuses[key] || 0) + 1;
    }
  }
}

Promise.all(Array.from({ length: Number(workers) }, loop)).then(() => {
  const l = tally.latencies_ms.sort((a, b) => a - b);
  const q = (p) => (l.length ? l[Math.min(l.length - 1, Math.floor(p * l.length))] : null);
  console.log(JSON.stringify({ ok: tally.ok, failed: tally.failed, statuses: tally.statuses,
                               p50_ms: q(0.5), p99_ms: q(0.99) }));
}, (e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
