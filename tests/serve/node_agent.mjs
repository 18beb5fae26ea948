// A minimal ACP agent in node, for the compile-cache tests: answers initialize, session/new
// and session/prompt; a prompt's reply is one agent_message_chunk naming the process's
// NODE_COMPILE_CACHE (or "unset"); "probe-cache" answers whether it may list and write it. Exits cleanly on stdin EOF, as real node agents do.
import { readdirSync, writeFileSync } from "node:fs";
import { createInterface } from "node:readline";

// "probe-cache": can this process list its NODE_COMPILE_CACHE, and write into it?
function probeCache() {
  const dir = process.env.NODE_COMPILE_CACHE;
  const attempt = (fn) => {
    try {
      fn();
      return "ok";
    } catch (e) {
      return e.code ?? String(e);
    }
  };
  return `list=${attempt(() => readdirSync(dir))} write=${attempt(() => writeFileSync(`${dir}/planted`, "x"))}`;
}

const send = (msg) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
let n = 0;
const rl = createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const msg = JSON.parse(line);
  if (msg.method === "initialize") {
    send({ id: msg.id, result: { protocolVersion: 1, agentCapabilities: {}, authMethods: [] } });
  } else if (msg.method === "session/new") {
    send({ id: msg.id, result: { sessionId: `node-${process.pid}-${++n}` } });
  } else if (msg.method === "session/prompt") {
    const asked = msg.params.prompt?.[0]?.text;
    const text = asked === "probe-cache" ? probeCache() : (process.env.NODE_COMPILE_CACHE ?? "unset");
    send({
      method: "session/update",
      params: {
        sessionId: msg.params.sessionId,
        update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
      },
    });
    send({ id: msg.id, result: { stopReason: "end_turn" } });
  } else if (msg.id !== undefined && msg.method !== undefined) {
    send({ id: msg.id, error: { code: -32601, message: "Method not found" } });
  }
});
rl.on("close", () => process.exit(0));
