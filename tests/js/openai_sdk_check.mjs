// End-to-end check of a running `peerserve serve` with the official OpenAI Node SDK.
// Usage: node openai_sdk_check.mjs BASE_URL MODEL API_KEY MAX_NUM_SEQS
// Exits 0 when every check passes; prints one line per check.
import OpenAI from 'openai';

// The whole check's deadline: the SDK's timeout stops at the response headers, so a server
// that stalls mid-body was cut off only by the socket's 5-minute timeout, as long as the
// caller's own limit (ctest's), which then reported a bare timeout without this output.
setTimeout(() => {
  console.log('FAIL deadline: the check did not finish within 180 s');
  process.exit(1);
}, 180_000).unref();

const [baseURL, model, apiKey, maxNumSeqsArg] = process.argv.slice(2);
const maxNumSeqs = Number(maxNumSeqsArg || 4);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
let failures = 0;

function check(cond, what, detail = '') {
  if (cond) {
    console.log(`ok   ${what}`);
  } else {
    failures += 1;
    console.log(`FAIL ${what} ${detail}`);
  }
}

async function tokenCount(body) {
  const res = await fetch(`${baseURL}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = await res.json();
  return json.count;
}

async function expectStatus(promise, status, what) {
  try {
    await promise;
    check(false, what, '(no error)');
  } catch (err) {
    check(err instanceof OpenAI.APIError && err.status === status, what,
          `(got ${err.status} ${err.message})`);
  }
}

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Say something about the sea.' },
];

// 1. Chat completion.
const chat = await client.chat.completions.create({
  model, messages, max_tokens: 6, temperature: 0, ignore_eos: true,
});
check(chat.object === 'chat.completion', 'chat: object');
check(chat.choices.length === 1 && chat.choices[0].message.role === 'assistant', 'chat: one assistant choice');
check(typeof chat.choices[0].message.content === 'string' && chat.choices[0].message.content.length > 0,
      'chat: content is a non-empty string (6 tokens were generated)');
check(chat.choices[0].finish_reason === 'length', 'chat: finish_reason length', chat.choices[0].finish_reason);
check(chat.usage.completion_tokens === 6, 'chat: usage.completion_tokens', JSON.stringify(chat.usage));
const chatPromptTokens = await tokenCount({ model, messages, add_generation_prompt: true });
check(chat.usage.prompt_tokens === chatPromptTokens, 'chat: usage.prompt_tokens = /tokenize count',
      `${chat.usage.prompt_tokens} vs ${chatPromptTokens}`);
check(chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'chat: total_tokens');

// 2. Streamed chat: same greedy text, role first, finish reason, usage chunk last.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 6, temperature: 0, ignore_eos: true, stream: true,
  stream_options: { include_usage: true },
});
let streamed = '';
let sawRole = false;
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role === 'assistant') sawRole = true;
    if (c.delta.content) streamed += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(sawRole, 'stream chat: role delta');
check(streamed === chat.choices[0].message.content, 'stream chat: text equals non-streamed text',
      JSON.stringify([streamed, chat.choices[0].message.content]));
check(finish === 'length', 'stream chat: finish_reason length', finish);
check(usage && usage.completion_tokens === 6 && usage.prompt_tokens === chatPromptTokens,
      'stream chat: usage chunk', JSON.stringify(usage));
check(chunks >= 3, 'stream chat: several chunks', String(chunks));

// 3. Completion and streamed completion.
const prompt = 'Once upon a time';
const completion = await client.completions.create({
  model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true,
});
check(completion.object === 'text_completion', 'completion: object');
check(completion.choices[0].finish_reason === 'length', 'completion: finish_reason length');
check(completion.usage.completion_tokens === 12, 'completion: usage.completion_tokens');
const completionPromptTokens = await tokenCount({ model, prompt });
check(completion.usage.prompt_tokens === completionPromptTokens, 'completion: usage.prompt_tokens',
      `${completion.usage.prompt_tokens} vs ${completionPromptTokens}`);
const text = completion.choices[0].text;
check(typeof text === 'string' && text.length > 0, 'completion: non-empty text (12 tokens were generated)');
const cstream = await client.completions.create({
  model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, stream: true,
  stream_options: { include_usage: true },
});
let ctext = '';
let cusage = null;
for await (const chunk of cstream) {
  if (chunk.usage) cusage = chunk.usage;
  for (const c of chunk.choices) ctext += c.text;
}
check(ctext === text, 'stream completion: text equals non-streamed text');
check(cusage && cusage.completion_tokens === 12, 'stream completion: usage');

// 4. A stop string taken from the greedy output ends generation there, with reason "stop".
const chars = Array.from(text);
let stop = null;
for (let i = 2; i + 2 <= chars.length && !stop; i += 1) {
  const s = chars.slice(i, i + 2).join('');
  if (!s.includes('\uFFFD')) stop = s;
}
if (stop) {
  const stopped = await client.completions.create({
    model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true, stop: [stop],
  });
  check(stopped.choices[0].finish_reason === 'stop', 'stop string: finish_reason stop',
        JSON.stringify(stopped.choices[0]));
  check(stopped.choices[0].text === text.slice(0, text.indexOf(stop)), 'stop string: text cut before it',
        JSON.stringify([stopped.choices[0].text, text, stop]));
} else {
  // 12 tokens of the trained model's text always have one: empty or garbled output.
  check(false, 'stop string: a clean 2-character substring in the sample output', JSON.stringify(text));
}

// 5. n > 1 with a seed: n choices, usage summed over choices.
const multi = await client.completions.create({
  model, prompt, max_tokens: 5, temperature: 1.0, seed: 7, n: 3, ignore_eos: true,
});
check(multi.choices.length === 3 && new Set(multi.choices.map((c) => c.index)).size === 3, 'n=3: three choices');
check(multi.usage.completion_tokens === 15, 'n=3: completion tokens summed', JSON.stringify(multi.usage));
const again = await client.completions.create({
  model, prompt, max_tokens: 5, temperature: 1.0, seed: 7, n: 3, ignore_eos: true,
});
check(JSON.stringify(again.choices.map((c) => c.text)) === JSON.stringify(multi.choices.map((c) => c.text)),
      'seeded sampling is reproducible');

// 6. Logprobs.
const lp = await client.chat.completions.create({
  model, messages, max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3,
});
const content = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
check(Array.isArray(content) && content.length === 4, 'logprobs: one entry per token');
check(content && content.every((e) => e.logprob <= 0 && e.top_logprobs.length <= 3 && e.top_logprobs.length >= 1),
      'logprobs: values and top_logprobs');
check(content && content.every((e) => e.top_logprobs[0].logprob >= e.logprob - 1e-6),
      'logprobs: greedy token is the most likely');

// 6b. Scoring a text (echo, logprobs, max_tokens 0): the prompt back with one logprob per token.
const scored = await client.completions.create({
  model, prompt, echo: true, logprobs: 2, max_tokens: 0, temperature: 0,
});
const slp = scored.choices[0].logprobs;
check(scored.choices[0].text === prompt, 'echo: the prompt is the text', JSON.stringify(scored.choices[0].text));
check(slp && slp.tokens.length === completionPromptTokens && slp.token_logprobs[0] === null &&
      slp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0),
      'echo: a logprob per prompt token after the first', JSON.stringify(slp));
check(scored.usage.completion_tokens === 0, 'echo: max_tokens 0 counts no completion token',
      JSON.stringify(scored.usage));

// 6c. Structured outputs: response_format json_schema (a finite language, so any model ends).
const schema = {
  type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 0, maximum: 9 } },
  required: ['ok', 'n'], additionalProperties: false,
};
const structured = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'Answer in JSON.' }], max_tokens: 32, temperature: 0,
  response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } },
});
let parsed = null;
try { parsed = JSON.parse(structured.choices[0].message.content); } catch (e) { /* checked below */ }
check(structured.choices[0].finish_reason === 'stop' && parsed !== null &&
      typeof parsed.ok === 'boolean' && Number.isInteger(parsed.n) && parsed.n >= 0 && parsed.n <= 9 &&
      Object.keys(parsed).join(',') === 'ok,n',
      'response_format json_schema: the answer is an instance, keys in the schema\'s order',
      JSON.stringify(structured.choices[0]));
await expectStatus(client.chat.completions.create({
  model, messages: [{ role: 'user', content: 'x' }], max_tokens: 4,
  response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: {} } } },
}), 400, 'response_format json_schema: an unsupported keyword -> 400');

// 7. Errors come back as the SDK's typed errors.
await expectStatus(client.completions.create({ model, prompt, max_tokens: 4, temperature: 7 }), 400,
                   'error: bad temperature -> 400');
await expectStatus(client.completions.create({ model: 'no-such-model', prompt, max_tokens: 4 }), 404,
                   'error: unknown model -> 404');
const badKey = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
await expectStatus(badKey.models.list(), 401, 'error: wrong API key -> 401');

// 8. More concurrent requests than --max-num-seqs all complete.
const many = await Promise.all(Array.from({ length: maxNumSeqs * 3 }, (_, i) =>
  client.completions.create({ model, prompt: `request ${i}`, max_tokens: 8, temperature: 0, ignore_eos: true })));
check(many.every((r) => r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 8),
      `concurrency: ${many.length} requests > max_num_seqs ${maxNumSeqs} all complete`);

// 9. Models list.
const models = await client.models.list();
check(models.data.some((m) => m.id === model), 'models: served model listed');

console.log(failures === 0 ? 'ALL OK' : `${failures} FAILED`);
process.exit(failures === 0 ? 0 : 1);
