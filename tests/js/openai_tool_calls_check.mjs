// Tool calling against a running `peerserve serve --allow-forced-output` with the official
// OpenAI Node SDK and its tool helpers (runTools, the chat stream's tool events). The
// model's answers are fixed by the testing hook peerserve_forced_output, so the checks know
// what the model "said"; the server's parsing, ids, finish reasons and streaming are what
// is tested.
// Usage: node openai_tool_calls_check.mjs BASE_URL MODEL
// Exits 0 when every check passes; prints one line per check and "ALL OK" at the end.
import OpenAI from 'openai';

// The whole check's deadline: the SDK's timeout stops at the response headers, so a server
// that stalls mid-body was cut off only by the socket's 5-minute timeout, as long as the
// caller's own limit (ctest's), which then reported a bare timeout without this output.
setTimeout(() => {
  console.log('FAIL deadline: the check did not finish within 180 s');
  process.exit(1);
}, 180_000).unref();

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
let failures = 0;

function check(cond, what, detail = '') {
  if (cond) {
    console.log(`ok   ${what}`);
  } else {
    failures += 1;
    console.log(`FAIL ${what} ${detail}`);
  }
}

const EOS = '<｜end▁of▁sentence｜>';
const call = (name, args) =>
  `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${args}\n\`\`\`<｜tool▁call▁end｜>`;
const calls = (...items) => `<｜tool▁calls▁begin｜>${items.join('\n')}<｜tool▁calls▁end｜>${EOS}`;

const weatherSchema = {
  type: 'object',
  properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['c', 'f'] } },
  required: ['city'],
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather', parameters: weatherSchema } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris and the time?' }];
const twoCalls = 'Checking.' + calls(call('get_weather', '{"city": "Paris", "unit": "c"}'), call('get_time', '{}'));

// 1. Non-streaming: content before the calls, two calls with ids, finish_reason tool_calls.
{
  const r = await client.chat.completions.create({
    model, messages, tools, peerserve_forced_output: twoCalls,
  });
  const m = r.choices[0].message;
  check(r.choices[0].finish_reason === 'tool_calls', 'create: finish_reason tool_calls', r.choices[0].finish_reason);
  check(m.content === 'Checking.', 'create: content before the calls', JSON.stringify(m.content));
  check(m.tool_calls?.length === 2, 'create: two tool calls', JSON.stringify(m.tool_calls));
  check(m.tool_calls?.[0].type === 'function' && m.tool_calls[0].function.name === 'get_weather',
        'create: first call names get_weather');
  check(JSON.stringify(JSON.parse(m.tool_calls?.[0].function.arguments ?? 'null')) === '{"city":"Paris","unit":"c"}',
        'create: first call arguments', m.tool_calls?.[0].function.arguments);
  check(m.tool_calls?.[1].function.name === 'get_time' && m.tool_calls[1].function.arguments === '{}',
        'create: second call');
  check(typeof m.tool_calls?.[0].id === 'string' && m.tool_calls[0].id.startsWith('call_') &&
        m.tool_calls[0].id !== m.tool_calls[1].id, 'create: distinct call ids');

  // parallel_tool_calls false keeps the first call only.
  const one = await client.chat.completions.create({
    model, messages, tools, parallel_tool_calls: false, peerserve_forced_output: twoCalls,
  });
  check(one.choices[0].message.tool_calls?.length === 1, 'parallel_tool_calls false: one call');
}

// 2. The stream helper: tool-call events with incremental arguments, and the final message.
{
  const stream = client.beta.chat.completions.stream({
    model, messages, tools, peerserve_forced_output: twoCalls,
  });
  let deltas = 0;
  const done = [];
  stream.on('tool_calls.function.arguments.delta', () => { deltas += 1; });
  stream.on('tool_calls.function.arguments.done', (e) => done.push(e));
  const final = await stream.finalChatCompletion();
  const m = final.choices[0].message;
  check(final.choices[0].finish_reason === 'tool_calls', 'stream: finish_reason tool_calls', final.choices[0].finish_reason);
  check(m.content === 'Checking.', 'stream: content', JSON.stringify(m.content));
  check(m.tool_calls?.length === 2 && m.tool_calls[0].function.name === 'get_weather' &&
        m.tool_calls[0].function.arguments === '{"city": "Paris", "unit": "c"}',
        'stream: assembled calls equal the non-streamed ones', JSON.stringify(m.tool_calls));
  check(deltas >= 4, 'stream: arguments arrive in several deltas', `${deltas}`);
  check(done.length === 2 && done[0].name === 'get_weather' && done[0].arguments.includes('Paris'),
        'stream: arguments.done per call', JSON.stringify(done));
}

// 3. runTools: the SDK calls our function with the parsed arguments, sends the result back
//    as a tool message, and the model's next answer (turn 2 of the forced outputs) is text.
for (const streamMode of [false, true]) {
  const seen = [];
  const runner = client.beta.chat.completions.runTools({
    model,
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    stream: streamMode,
    tools: [{
      type: 'function',
      function: {
        name: 'get_weather',
        parameters: weatherSchema,
        parse: JSON.parse,
        function: (args) => { seen.push(args); return { temperature_c: 21, sky: 'clear' }; },
      },
    }],
    peerserve_forced_output: [calls(call('get_weather', '{"city": "Paris"}')), `It is 21 °C and clear in Paris.${EOS}`],
  });
  const content = await runner.finalContent();
  const all = runner.messages;
  const toolMessage = all.find((m) => m.role === 'tool');
  const label = streamMode ? 'runTools (stream)' : 'runTools';
  check(seen.length === 1 && seen[0].city === 'Paris', `${label}: function called with parsed arguments`, JSON.stringify(seen));
  check(toolMessage && JSON.parse(toolMessage.content).temperature_c === 21, `${label}: tool result sent back`);
  check(content === 'It is 21 °C and clear in Paris.', `${label}: final answer after the tool result`, JSON.stringify(content));
}

// 4. tool_choice: a named function and "required" force a call (the server starts it).
{
  const named = await client.chat.completions.create({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_time' } },
    peerserve_forced_output: `{"tz": "UTC"}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`,
  });
  const nm = named.choices[0].message;
  check(nm.tool_calls?.length === 1 && nm.tool_calls[0].function.name === 'get_time' &&
        nm.tool_calls[0].function.arguments === '{"tz": "UTC"}', 'tool_choice named: the named call', JSON.stringify(nm));
  const required = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'required',
    peerserve_forced_output: `get_weather\n\`\`\`json\n{"city": "Oslo"}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`,
  });
  check(required.choices[0].message.tool_calls?.[0]?.function.name === 'get_weather' &&
        required.choices[0].finish_reason === 'tool_calls', 'tool_choice required: a call');
  const namedStream = client.beta.chat.completions.stream({
    model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_time' } },
    peerserve_forced_output: `{"tz": "CET"}\n\`\`\`<｜tool▁call▁end｜><｜tool▁calls▁end｜>${EOS}`,
  });
  const nsFinal = await namedStream.finalChatCompletion();
  check(nsFinal.choices[0].message.tool_calls?.[0]?.function.name === 'get_time' &&
        nsFinal.choices[0].message.tool_calls[0].function.arguments === '{"tz": "CET"}', 'tool_choice named (stream)');
  const none = await client.chat.completions.create({
    model, messages, tools, tool_choice: 'none', peerserve_forced_output: twoCalls,
  });
  check(!none.choices[0].message.tool_calls && none.choices[0].finish_reason === 'stop' &&
        none.choices[0].message.content.includes('get_weather'), 'tool_choice none: output stays text');
}

// 5. Malformed model output comes back as text, streamed or not, and the server goes on.
{
  const unterminated = `Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\`\`\`json\n{"city": "Pa${EOS}`;
  const badJson = calls(call('get_weather', '{"city": Paris}'));
  for (const [what, forced] of [['unterminated call', unterminated], ['bad JSON arguments', badJson]]) {
    const r = await client.chat.completions.create({ model, messages, tools, peerserve_forced_output: forced });
    const m = r.choices[0].message;
    check(!m.tool_calls && r.choices[0].finish_reason === 'stop' && m.content.includes('get_weather'),
          `${what}: returned as text`, JSON.stringify(r.choices[0]));
    const s = client.beta.chat.completions.stream({ model, messages, tools, peerserve_forced_output: forced });
    const f = await s.finalChatCompletion();
    check(f.choices[0].finish_reason === 'stop', `${what} (stream): finish_reason stop, not tool_calls`,
          f.choices[0].finish_reason);
  }
  const after = await client.chat.completions.create({ model, messages, max_tokens: 3 });
  check(after.choices[0].message.content !== undefined, 'server answers after malformed output');
}

console.log(failures === 0 ? 'ALL OK' : `${failures} FAILED`);
process.exit(failures === 0 ? 0 : 1);
