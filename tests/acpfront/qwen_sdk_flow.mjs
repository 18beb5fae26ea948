// Drive acp-serve's /acp with the published @qwen-code/sdk DaemonClient over one of its ACP
// transports (AcpHttpTransport or AcpWsTransport), unchanged.
// Usage: node [--experimental-websocket] qwen_sdk_flow.mjs <sdk dist/daemon dir URL> <baseUrl> <token> <http|ws>
// Prints one JSON line of findings.
const [sdkDir, baseUrl, token, kind] = process.argv.slice(2);
const sdk = await import(`${sdkDir}/index.js`);
const transports = await import(`${sdkDir}/transports.js`);
const { DaemonClient } = sdk;

const out = { kind };
const transport = kind === 'ws'
  ? new transports.AcpWsTransport(baseUrl.replace(/^http/, 'ws') + '/acp', token)
  : new transports.AcpHttpTransport(baseUrl, token, globalThis.fetch.bind(globalThis));
const client = new DaemonClient({ baseUrl, token, transport });
out.transport = transport.type;
out.health = await client.health();

const session = await client.createOrAttachSession({ sessionScope: 'thread' });
out.session = { sessionId: session.sessionId, attached: session.attached, clientId: session.clientId };
const sid = session.sessionId;
const cid = session.clientId;

const abort = new AbortController();
const seen = [];
let permissionAnswered = null;
let text = '';
const reader = (async () => {
  for await (const event of client.subscribeEvents(sid, { signal: abort.signal })) {
    seen.push(event.type);
    if (event.type === 'agent_message_chunk' && event.data?.content?.text) text += event.data.content.text;
    if (event.type === 'permission_request' && permissionAnswered === null) {
      permissionAnswered = false;
      permissionAnswered = await client.respondToSessionPermission(
        sid, event.data.requestId, { outcome: { outcome: 'selected', optionId: 'allow' } }, cid);
    }
    if (event.type === 'session_closed' || event.type === 'session_died') break;
  }
})().catch((err) => { if (err.name !== 'AbortError') out.readerError = String(err); });

// Let the subscription attach before the first prompt.
await new Promise((r) => setTimeout(r, 300));
const first = await client.prompt(sid, { prompt: [{ type: 'text', text: 'hello over acp' }] }, undefined, cid);
out.firstStopReason = first.stopReason;
const second = await client.prompt(sid, { prompt: [{ type: 'text', text: `[write acp-${kind}.txt written over ${kind}]` }] }, undefined, cid);
out.secondStopReason = second.stopReason;
out.permissionAnswered = permissionAnswered;
out.text = text;
out.heartbeat = await client.heartbeat(sid, cid);
try {
  await client.closeSession(sid, cid);
  out.closed = true;
} catch (err) {
  out.closed = false;
  out.closeError = String(err);
}
await Promise.race([reader, new Promise((r) => setTimeout(r, 5000))]);
abort.abort();
out.seen = seen;
transport.dispose();
console.log(JSON.stringify(out));
