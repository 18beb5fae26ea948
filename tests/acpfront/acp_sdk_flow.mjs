// Drive acp-serve with the official @agentclientprotocol/sdk 2.4.0 client, unchanged, over
// Streamable HTTP (createHttpStream), WebSocket (createWebSocketStream), or stdio through a
// spawned `acp-serve attach URL --token T` (ndJsonStream).
// Usage: node --experimental-websocket acp_sdk_flow.mjs <sdk package dir URL> <baseUrl> <token> <http|ws|stdio> [python]
// Prints one JSON line of findings.
import { spawn } from 'node:child_process';
import { Readable, Writable } from 'node:stream';

const [sdkDir, baseUrl, token, kind, python] = process.argv.slice(2);
const acp = await import(`${sdkDir}/dist/v1/stable/acp.js`);
const auth = { Authorization: `Bearer ${token}` };

let stream;
let child;
if (kind === 'http') {
  const { createHttpStream } = await import(`${sdkDir}/dist/transports/http-stream.js`);
  stream = createHttpStream(`${baseUrl}/acp`, { headers: auth });
} else if (kind === 'ws') {
  const { createWebSocketStream } = await import(`${sdkDir}/dist/transports/ws-stream.js`);
  // Node's WebSocket takes headers in its init object; the SDK passes them as a third argument.
  class HeaderWebSocket extends WebSocket {
    constructor(url, protocols, options) {
      super(url, { protocols: protocols ?? [], headers: options?.headers });
    }
  }
  stream = createWebSocketStream(`${baseUrl.replace(/^http/, 'ws')}/acp`, { headers: auth, WebSocket: HeaderWebSocket });
} else {
  child = spawn(python, ['-m', 'serve', 'attach', baseUrl, '--token', token], { stdio: ['pipe', 'pipe', 'inherit'] });
  stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
}

const out = { kind };
const updates = [];
let text = '';
let permissions = 0;
const app = new acp.ClientApp()
  .onNotification('session/update', (cx) => {
    const u = cx.params.update;
    updates.push(u.sessionUpdate);
    if (u.sessionUpdate === 'agent_message_chunk' && u.content?.type === 'text') text += u.content.text;
  })
  .onNotification('*', () => {})
  .onRequest('session/request_permission', (cx) => {
    permissions += 1;
    out.permissionOptions = cx.params.options.map((o) => o.optionId);
    return { outcome: { outcome: 'selected', optionId: 'allow' } };
  });
const conn = app.connect(stream);
const agent = conn.agent;
try {
  const init = await agent.request('initialize', {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    clientInfo: { name: 'acp-sdk-test', version: '1' },
  });
  out.protocolVersion = init.protocolVersion;
  out.loadSession = init.agentCapabilities?.loadSession;
  const cwd = process.env.ACP_TEST_CWD;
  const created = await agent.request('session/new', { cwd, mcpServers: [] });
  const sid = created.sessionId;
  out.sessionId = sid;
  const first = await agent.request('session/prompt', { sessionId: sid, prompt: [{ type: 'text', text: `hello over ${kind}` }] });
  out.firstStopReason = first.stopReason;
  const second = await agent.request('session/prompt', {
    sessionId: sid,
    prompt: [{ type: 'text', text: `[write acp-official-${kind}.txt official ${kind}]` }],
  });
  out.secondStopReason = second.stopReason;
  out.permissions = permissions;
  const listed = await agent.request('session/list', {});
  out.listed = listed.sessions.some((s) => s.sessionId === sid);
  await agent.request('session/close', { sessionId: sid });
  out.closed = true;
} catch (err) {
  out.error = String(err?.message ?? err);
  out.errorData = err?.data;
}
out.text = text;
out.updates = updates;
conn.close();
await new Promise((r) => setTimeout(r, 200));
if (child) {
  child.stdin.end();
  await new Promise((r) => { child.on('exit', (code) => { out.attachExit = code; r(); }); setTimeout(r, 5000); });
}
console.log(JSON.stringify(out));
process.exit(0);
