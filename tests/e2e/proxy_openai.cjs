// proxy_openai.cjs — the official OpenAI Node SDK as a client of sluice-proxy
// (tests/e2e/proxy_openai_node.c runs it). Usage: node proxy_openai.cjs PROXY_URL MODE
//   chat   a plain chat, then a streamed one; prints what came back as one JSON line
//   error  a call the proxy refuses: the SDK must surface the proxy's status and message
// Exit status 0 when the SDK saw what it should, 1 otherwise (with the reason on stderr).
'use strict';
const OpenAI = require('openai');

const [url, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-sluice-test', maxRetries: 0 });
const messages = [{ role: 'user', content: 'Say hi' }];

async function chat() {
  const plain = await client.chat.completions.create({ model: 'sim', messages });
  const content = plain.choices[0].message.content;
  if (plain.object !== 'chat.completion' || !content)
    throw new Error('plain chat: ' + JSON.stringify(plain));
  const stream = await client.chat.completions.create({ model: 'sim', messages, stream: true });
  let chunks = 0, text = '';
  for await (const chunk of stream) {
    chunks++;
    text += (chunk.choices[0] && chunk.choices[0].delta && chunk.choices[0].delta.content) || '';
  }
  if (chunks < 2 || !text) throw new Error(`streamed chat: ${chunks} chunks, text '${text}'`);
  console.log(JSON.stringify({ plain: content, chunks, text }));
}

async function error() {
  try {
    await client.chat.completions.create({ model: 'sim', messages });
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    console.log(JSON.stringify({ status: e.status, message: e.message, code: e.code }));
    return;
  }
  throw new Error('the call succeeded; the proxy should have refused it');
}

(mode === 'error' ? error : chat)().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
