// Drive acp-serve with the published @qwen-code/sdk DaemonClient, unchanged.
// Usage: node sdk_flow.mjs <sdk daemon module path> <baseUrl>. Prints one JSON line of findings.
const [sdkPath, baseUrl, token] = process.argv.slice(2);
const sdk = await import(sdkPath);
const { DaemonClient, reduceDaemonSessionEvent, createDaemonSessionViewState, asKnownDaemonEvent } = sdk;

const out = {};
const client = new DaemonClient({ baseUrl, token });
out.health = await client.health();
const caps = await client.capabilities();
out.features = caps.features;
out.mode = caps.mode;
out.workspaceCwd = caps.workspaceCwd;

const session = await client.createOrAttachSession({ sessionScope: 'thread' });
out.session = { sessionId: session.sessionId, attached: session.attached, clientId: session.clientId };
const sid = session.sessionId;
const cid = session.clientId;

// Subscribe from the start and reduce every event with the SDK's own reducer.
const abort = new AbortController();
let state = createDaemonSessionViewState();
const seen = [];
const rejected = [];
let permissionAnswered = null;
const reader = (async () => {
  for await (const event of client.subscribeEvents(sid, { lastEventId: 0, signal: abort.signal })) {
    seen.push(event.type);
    // The SDK's own validator: every event we send must parse as its known shape.
    // (0.1.14 has no validator case for replay_complete, which qwen serve sends too.)
    if (asKnownDaemonEvent(event) === undefined && event.type !== 'replay_complete') {
      rejected.push(event);
    }
    state = reduceDaemonSessionEvent(state, event);
    if (event.type === 'permission_request' && permissionAnswered === null) {
      permissionAnswered = await client.respondToSessionPermission(
        sid, event.data.requestId, { outcome: { outcome: 'selected', optionId: 'allow' } }, cid);
    }
    if (event.type === 'session_closed' || event.type === 'session_died') break;
  }
})().catch((err) => { if (err.name !== 'AbortError') out.readerError = String(err); });

const first = await client.prompt(sid, { prompt: [{ type: 'text', text: 'hello from the sdk' }] }, undefined, cid);
out.firstStopReason = first.stopReason;
const second = await client.prompt(sid, { prompt: [{ type: 'text', text: '[write sdk.txt written by sdk]' }] }, undefined, cid);
out.secondStopReason = second.stopReason;
out.permissionAnswered = permissionAnswered;
out.heartbeat = await client.heartbeat(sid, cid);
await client.closeSession(sid, cid);
await Promise.race([reader, new Promise((r) => setTimeout(r, 5000))]);
abort.abort();
out.seen = seen;
out.state = {
  alive: state.alive,
  lastEventId: state.lastEventId,
  pendingPermissions: Object.keys(state.pendingPermissions).length,
  terminal: state.terminalEvent ? state.terminalEvent.type : null,
  rejected,
};
console.log(JSON.stringify(out));
