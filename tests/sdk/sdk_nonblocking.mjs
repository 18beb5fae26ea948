// promptNonBlocking() of the published @qwen-code/sdk against `acp-serve --prompt-response async`.
// Usage: node sdk_nonblocking.mjs <sdk daemon module path> <baseUrl> <token>. Prints one JSON line.
// The SDK sends no Prefer header: the daemon answers 202 at admission, the turn waits for a
// permission answer that this script gives only after promptNonBlocking() returned and its
// AbortSignal was aborted (a caller going away must not cancel the turn).
const [sdkPath, baseUrl, token] = process.argv.slice(2);
const { DaemonClient } = await import(sdkPath);

const out = {};
const client = new DaemonClient({ baseUrl, token });
const session = await client.createOrAttachSession({ sessionScope: 'thread' });
const sid = session.sessionId;
const cid = session.clientId;

const caller = new AbortController();
const accepted = await client.promptNonBlocking(
  sid, { prompt: [{ type: 'text', text: '[write sdk-async.txt written later]' }] }, caller.signal, cid);
caller.abort();
out.accepted = accepted;

const seen = [];
const reader = new AbortController();
for await (const event of client.subscribeEvents(sid, { lastEventId: accepted.lastEventId, signal: reader.signal })) {
  seen.push(event.type);
  if (event.type === 'permission_request') {
    out.permission = await client.respondToSessionPermission(
      sid, event.data.requestId, { outcome: { outcome: 'selected', optionId: 'allow' } }, cid);
  }
  if ((event.type === 'turn_complete' || event.type === 'turn_error') && event.promptId === accepted.promptId) {
    out.end = { type: event.type, stopReason: event.data.stopReason ?? null };
    break;
  }
}
reader.abort();
out.seen = seen;
await client.closeSession(sid, cid);
console.log(JSON.stringify(out));
