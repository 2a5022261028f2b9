// Drives the official OpenAI Node client against the gateway for the
// end-to-end tests (xcaddy-test/e2e/quota_test.go), and prints one JSON
// line: what the client saw for each request, in order.
//
// Environment: FQ_BASE (the site's base URL), FQ_TENANT (sent as
// X-Tenant-ID), FQ_PLAN (comma-separated id:maxRetries:maxTokens). Requests
// set ignore_eos, so the fake upstream generates exactly max_tokens.
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.FQ_BASE + '/v1',
  apiKey: 'unused',
  timeout: 60_000,
  defaultHeaders: { 'X-Tenant-ID': process.env.FQ_TENANT },
});

// pick keeps the headers the tests look at.
function pick(headers) {
  const out = {};
  if (!headers) return out;
  const entries = typeof headers.entries === 'function' ? headers.entries() : Object.entries(headers);
  for (const [k, v] of entries) {
    const key = k.toLowerCase();
    if (key.startsWith('x-ratelimit-') || key.startsWith('x-fair-queue-') || key.startsWith('retry-after')) out[key] = v;
  }
  return out;
}

const results = [];
for (const step of process.env.FQ_PLAN.split(',')) {
  const [id, retries, maxTokens] = step.split(':');
  const start = Date.now();
  try {
    const { data, response } = await client.chat.completions
      .create(
        { model: 'fake-model', messages: [{ role: 'user', content: 'hello there' }], max_tokens: Number(maxTokens), ignore_eos: true },
        { maxRetries: Number(retries), headers: { 'X-Test-Id': id } },
      )
      .withResponse();
    results.push({ id, ok: true, status: response.status, ms: Date.now() - start, headers: pick(response.headers), usage: data.usage });
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    results.push({
      id, ok: false, status: e.status, ms: Date.now() - start, headers: pick(e.headers),
      code: e.code, type: e.type, reason: e.error?.reason, message: e.message,
    });
  }
}
console.log(JSON.stringify(results));
