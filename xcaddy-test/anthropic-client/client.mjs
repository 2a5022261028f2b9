// Drives the official Anthropic TypeScript client against the gateway for
// the end-to-end tests (xcaddy-test/e2e/anthropic_test.go), and prints one
// JSON line: what the client saw for each step, in order.
//
// Environment: FQ_BASE (the site's base URL; the client adds /v1/messages)
// and FQ_PLAN, a JSON list of steps {id, tenant, kind, max_tokens,
// retries}, kind being:
//   message  one message (messages.create);
//   stream   one streamed message (messages.stream), its events counted;
//   tools    a message with a tool, answered by a tool call, then the
//            tool's result sent back (X-Test-Id <id>-result) and
//            answered in text.
// Requests set ignore_eos (a field of the fake's: the fake upstream then
// generates exactly max_tokens) unless the step sets ignore_eos false. The
// tenant goes in X-Tenant-ID.
import Anthropic from '@anthropic-ai/sdk';

const client = new Anthropic({
  baseURL: process.env.FQ_BASE,
  apiKey: 'unused',
  timeout: 60_000,
});

// pick keeps the headers the tests look at.
function pick(headers) {
  const out = {};
  if (!headers) return out;
  for (const [k, v] of headers.entries()) {
    const key = k.toLowerCase();
    if (key.startsWith('x-ratelimit-') || key.startsWith('x-fair-queue-') || key.startsWith('retry-after')) out[key] = v;
  }
  return out;
}

const weather = {
  name: 'get_weather',
  description: 'The weather at a place.',
  input_schema: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] },
};

async function run(step, opts) {
  const params = {
    model: 'claude-fake',
    max_tokens: step.max_tokens,
    ignore_eos: step.ignore_eos ?? true,
    messages: [{ role: 'user', content: 'What is the weather in Lisbon today?' }],
  };
  switch (step.kind) {
    case 'message': {
      const { data, response } = await client.messages.create(params, opts).withResponse();
      return { status: response.status, headers: pick(response.headers), message: data };
    }
    case 'stream': {
      const stream = client.messages.stream(params, opts);
      const events = {};
      let text = '';
      stream.on('streamEvent', (ev) => { events[ev.type] = (events[ev.type] || 0) + 1; });
      stream.on('text', (delta) => { text += delta; });
      const message = await stream.finalMessage();
      const { response } = await stream.withResponse();
      return { status: response.status, headers: pick(response.headers), message, events, text };
    }
    case 'tools': {
      const first = await client.messages.create({ ...params, tools: [weather] }, opts);
      const call = first.content.find((b) => b.type === 'tool_use');
      const { data, response } = await client.messages.create({
        ...params,
        tools: [weather],
        messages: [
          ...params.messages,
          { role: 'assistant', content: first.content },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: call?.id ?? 'none', content: 'Sunny, 24 degrees.' }] },
        ],
      }, { ...opts, headers: { ...opts.headers, 'X-Test-Id': step.id + '-result' } }).withResponse();
      return { status: response.status, headers: pick(response.headers), first, message: data };
    }
    default:
      throw new Error('unknown step kind ' + step.kind);
  }
}

const results = [];
for (const step of JSON.parse(process.env.FQ_PLAN)) {
  const opts = { maxRetries: step.retries ?? 0, headers: { 'X-Tenant-ID': step.tenant, 'X-Test-Id': step.id } };
  const start = Date.now();
  try {
    const r = await run(step, opts);
    results.push({ id: step.id, ok: true, ms: Date.now() - start, ...r });
  } catch (e) {
    if (!(e instanceof Anthropic.APIError)) throw e;
    results.push({
      id: step.id, ok: false, ms: Date.now() - start, status: e.status, headers: pick(e.headers),
      class: e.constructor.name,
      permission_denied: e instanceof Anthropic.PermissionDeniedError,
      rate_limited: e instanceof Anthropic.RateLimitError,
      type: e.type, error_code: e.errorCode, api_message: e.apiMessage, error_message: e.message, body: e.error,
    });
  }
}
console.log(JSON.stringify(results));
