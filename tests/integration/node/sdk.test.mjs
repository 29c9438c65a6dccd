// sdk.test.mjs - the official OpenAI and Anthropic Node SDKs against a running
// ecs-coordinator: chat and completions (streamed and not, stop strings,
// usage), /v1/messages (streamed and not), errors as the SDKs raise them,
// tool calls in both APIs (a forced call whole and streamed, its result),
// reasoning (reasoning_content, thinking blocks) with a second server.
// usage: node sdk.test.mjs PORT MODEL_ID [THINK_PORT THINK_MODEL_ID]
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const [port, model] = process.argv.slice(2);
const openai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'unused', maxRetries: 0 });
let failed = 0;

async function check(name, fn) {
  try {
    await fn();
    console.log(`PASS ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three rivers.' }];
const greedy = { model, temperature: 0, max_tokens: 16 };

await check('openai: models.list names the model', async () => {
  const list = await openai.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
});

await check('openai: models.retrieve; anthropic: messages.countTokens equals the input tokens', async () => {
  assert.equal((await openai.models.retrieve(model)).id, model);
  const req = { model, system: 'Be brief.', messages: [{ role: 'user', content: 'Name three rivers.' }] };
  const n = await anthropic.messages.countTokens(req);
  const r = await anthropic.messages.create({ ...req, max_tokens: 1 });
  assert.equal(n.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens);
});

let chatText = '';
await check('openai: chat completion, whole', async () => {
  const r = await openai.chat.completions.create({ ...greedy, messages });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 16);
  assert.ok(r.usage.prompt_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 16);
  chatText = r.choices[0].message.content;
  assert.ok(chatText.length > 0);
});

await check('openai: chat completion, streamed with usage, equals the whole one', async () => {
  const stream = await openai.chat.completions.create({
    ...greedy, messages, stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, chatText);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
});

await check('openai: chat stop string', async () => {
  const stop = chatText.slice(Math.floor(chatText.length / 2), Math.floor(chatText.length / 2) + 2);
  const r = await openai.chat.completions.create({ ...greedy, messages, stop: [stop] });
  assert.equal(r.choices[0].message.content, chatText.slice(0, chatText.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('openai: chat logprobs', async () => {
  const r = await openai.chat.completions.create({ ...greedy, max_tokens: 4, messages, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  for (const t of lp) {
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.logprob <= 0);
    assert.equal(t.logprob, t.top_logprobs[0].logprob); // greedy picks the top one
  }
});

let complText = '';
await check('openai: completion, whole and streamed agree', async () => {
  const r = await openai.completions.create({ ...greedy, prompt: 'The river flows' });
  assert.equal(r.object, 'text_completion');
  complText = r.choices[0].text;
  assert.equal(r.usage.completion_tokens, 16);
  const stream = await openai.completions.create({
    ...greedy, prompt: 'The river flows', stream: true, stream_options: { include_usage: true },
  });
  let text = '', usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.text;
  }
  assert.equal(text, complText);
  assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
});

await check('openai: completion stop string, streamed', async () => {
  const stop = complText.slice(5, 8);
  const stream = await openai.completions.create({ ...greedy, prompt: 'The river flows', stop, stream: true });
  let text = '', finish = null;
  for await (const chunk of stream) for (const c of chunk.choices) { text += c.text; finish = c.finish_reason ?? finish; }
  assert.equal(text, complText.slice(0, complText.indexOf(stop)));
  assert.equal(finish, 'stop');
});

await check('openai: errors raise APIError with status and message', async () => {
  await assert.rejects(openai.chat.completions.create({ ...greedy, messages, n: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && /n = 1/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ ...greedy, model: 'other', messages }),
    (e) => e.status === 404 && /not found/.test(e.message));
});

let msgText = '';
await check('openai: JSON mode and logit_bias through the SDK', async () => {
  // the ids of '"' and '}' from the server's own /tokenize
  const ids = {};
  for (const t of ['"', '}']) {
    const r = await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST', body: JSON.stringify({ content: t }) });
    ids[t] = (await r.json()).tokens[0];
  }
  const body = { ...greedy, max_tokens: 200, messages, response_format: { type: 'json_object' },
    logit_bias: { [ids['"']]: 30, [ids['}']]: 25 } };
  const r = await openai.chat.completions.create(body);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const obj = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof obj, 'object');
  let streamed = '';
  for await (const ch of await openai.chat.completions.create({ ...body, stream: true }))
    streamed += ch.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r.choices[0].message.content);
  await assert.rejects(openai.chat.completions.create({ ...greedy, messages,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object',
      properties: { a: { type: 'string', format: 'email' } } } } } }),
  (e) => e instanceof OpenAI.APIError && e.status === 400 && /keyword 'format'/.test(e.message));
});

await check('openai: structured output (json_schema) through the SDK', async () => {
  const schema = { type: 'object', additionalProperties: false, required: ['city', 'rank'],
    properties: { city: { enum: ['Paris', 'Rome'] }, rank: { type: 'integer' } } };
  const r = await openai.chat.completions.create({ model, messages, max_tokens: 200, seed: 3,
    response_format: { type: 'json_schema', json_schema: { name: 'c', schema, strict: true } } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const o = JSON.parse(r.choices[0].message.content);
  assert.deepEqual(Object.keys(o).sort(), ['city', 'rank']);
  assert.ok(['Paris', 'Rome'].includes(o.city) && Number.isInteger(o.rank), JSON.stringify(o));
});

await check('anthropic: messages, whole', async () => {
  const r = await anthropic.messages.create({
    model, max_tokens: 16, temperature: 0, system: 'You are terse.',
    messages: [{ role: 'user', content: 'Name three rivers.' }],
  });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.content[0].type, 'text');
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 16);
  msgText = r.content[0].text;
  assert.equal(msgText, chatText); // the same conversation as the chat route
});

await check('anthropic: messages, streamed events, equals the whole one', async () => {
  const stream = anthropic.messages.stream({
    model, max_tokens: 16, temperature: 0, system: 'You are terse.',
    messages: [{ role: 'user', content: 'Name three rivers.' }],
  });
  const seen = new Set();
  stream.on('streamEvent', (ev) => seen.add(ev.type));
  const final = await stream.finalMessage();
  assert.equal(final.content[0].text, msgText);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 16);
  for (const t of ['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop',
    'message_delta', 'message_stop']) assert.ok(seen.has(t), `no ${t} event`);
});

await check('anthropic: stop_sequences and errors', async () => {
  const stop = msgText.slice(4, 7);
  const r = await anthropic.messages.create({
    model, max_tokens: 16, temperature: 0, system: 'You are terse.', stop_sequences: [stop],
    messages: [{ role: 'user', content: 'Name three rivers.' }],
  });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, stop);
  assert.equal(r.content[0].text, msgText.slice(0, msgText.indexOf(stop)));
  await assert.rejects(anthropic.messages.create({ model, max_tokens: 4, messages: [{ role: 'tool', content: 'x' }] }),
    (e) => e instanceof Anthropic.APIError && e.status === 400);
});

// Tools: a call forced by name (a random model: the constraint alone makes
// it a call whose arguments follow the schema), whole and streamed through
// the SDKs' own accumulation, and a conversation carrying the call's result.
const weather = {
  name: 'get_weather', description: 'The weather of a city',
  parameters: {
    type: 'object', additionalProperties: false, required: ['unit', 'days'],
    properties: { unit: { enum: ['c', 'f'] }, days: { type: 'integer' } },
  },
};
function weatherArgs(o) {
  assert.deepEqual(Object.keys(o).sort(), ['days', 'unit']);
  assert.ok(['c', 'f'].includes(o.unit) && Number.isInteger(o.days), JSON.stringify(o));
  return o;
}

await check('openai: tools, a forced call whole and streamed, then its result', async () => {
  const req = {
    model, temperature: 0, max_tokens: 300,
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools: [{ type: 'function', function: weather }, { type: 'function', function: { name: 'other' } }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  };
  const r = await openai.chat.completions.create(req);
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  const args = weatherArgs(JSON.parse(m.tool_calls[0].function.arguments));
  const stream = openai.beta.chat.completions.stream(req);
  const fin = await stream.finalChatCompletion();
  assert.equal(fin.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), args);
  const next = await openai.chat.completions.create({
    ...req, tool_choice: 'auto', max_tokens: 8,
    messages: [...req.messages, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '18 C' }],
  });
  assert.equal(next.choices[0].finish_reason, 'length');
});

await check('anthropic: tools, a forced tool_use whole and streamed, then its result', async () => {
  const req = {
    model, temperature: 0, max_tokens: 300,
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools: [{ name: weather.name, description: weather.description, input_schema: weather.parameters }],
    tool_choice: { type: 'tool', name: 'get_weather' },
  };
  const r = await anthropic.messages.create(req);
  assert.equal(r.stop_reason, 'tool_use');
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  weatherArgs(use.input);
  const fin = await anthropic.messages.stream(req).finalMessage();
  assert.equal(fin.stop_reason, 'tool_use');
  assert.deepEqual(fin.content.find((b) => b.type === 'tool_use').input, use.input);
  const next = await anthropic.messages.create({
    ...req, tool_choice: { type: 'auto' }, max_tokens: 8,
    messages: [...req.messages, { role: 'assistant', content: r.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 C' }] }],
  });
  assert.equal(next.stop_reason, 'max_tokens');
});

await check('openai: tool_choice required among two tools, streamed: a call following its tool', async () => {
  const count = { name: 'count', parameters: { type: 'object', additionalProperties: false,
    required: ['n'], properties: { n: { type: 'integer' } } } };
  const fin = await openai.beta.chat.completions.stream({
    model, temperature: 0, max_tokens: 300, messages: [{ role: 'user', content: 'Weather or count?' }],
    tools: [{ type: 'function', function: weather }, { type: 'function', function: count }],
    tool_choice: 'required',
  }).finalChatCompletion();
  assert.equal(fin.choices[0].finish_reason, 'tool_calls');
  const call = fin.choices[0].message.tool_calls[0].function;
  const args = JSON.parse(call.arguments);
  if (call.name === 'count') assert.ok(Number.isInteger(args.n) && Object.keys(args).length === 1);
  else { assert.equal(call.name, 'get_weather'); weatherArgs(args); }
});

// Reasoning, against a second server whose model's template opens the
// think block (made by test_serve_sdk.sh): random weights never close the
// think block, so the whole answer is reasoning_content / a thinking block;
// a past thinking block goes back in through the SDK's own types.
const [thinkPort, thinkModel] = process.argv.slice(4);
if (thinkPort) {
  const tOpenai = new OpenAI({ baseURL: `http://127.0.0.1:${thinkPort}/v1`, apiKey: 'unused', maxRetries: 0 });
  const tAnthropic = new Anthropic({ baseURL: `http://127.0.0.1:${thinkPort}`, apiKey: 'unused', maxRetries: 0 });
  const req = {
    model: thinkModel, temperature: 0, max_tokens: 8, ignore_eos: true, messages: [{ role: 'user', content: 'Hi?' }],
  };
  let reasoning = '';
  await check('openai: reasoning_content, whole and streamed; enable_thinking false', async () => {
    const r = await tOpenai.chat.completions.create(req);
    reasoning = r.choices[0].message.reasoning_content; // not in the SDK's types: the raw field
    assert.ok(typeof reasoning === 'string' && reasoning.length > 0, JSON.stringify(r));
    assert.equal(r.choices[0].message.content, '');
    let streamed = '', content = '';
    for await (const chunk of await tOpenai.chat.completions.create({ ...req, stream: true })) {
      for (const c of chunk.choices) {
        streamed += c.delta.reasoning_content ?? '';
        content += c.delta.content ?? '';
      }
    }
    assert.equal(streamed, reasoning);
    assert.equal(content, '');
    const off = await tOpenai.chat.completions.create({ ...req, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(off.choices[0].message.reasoning_content, undefined);
    assert.ok(off.choices[0].message.content.length > 0);
  });
  await check('anthropic: a thinking block, whole and through messages.stream().finalMessage()', async () => {
    const areq = { ...req, thinking: { type: 'enabled', budget_tokens: 1024 } };
    const r = await tAnthropic.messages.create(areq);
    assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(r.content[0].thinking, reasoning); // the same prompt as the chat route
    const fin = await tAnthropic.messages.stream(areq).finalMessage();
    assert.deepEqual(fin.content, r.content);
    const next = await tAnthropic.messages.create({
      ...areq, messages: [...areq.messages, { role: 'assistant', content: r.content },
        { role: 'user', content: 'And?' }],
    });
    assert.equal(next.stop_reason, 'max_tokens');
    const off = await tAnthropic.messages.create({ ...req, thinking: { type: 'disabled' } });
    assert.deepEqual(off.content.map((b) => b.type), ['text']);
  });
}

console.log(`sdk: ${failed} failed`);
process.exit(failed ? 1 : 0);
