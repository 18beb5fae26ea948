// A minimal ACP agent in node, for the compile-cache tests: answers initialize, session/new
// and session/prompt; a prompt's reply is one agent_message_chunk naming the process's
// NODE_COMPILE_CACHE (or "unset"). Exits cleanly on stdin EOF, as real node agents do.
import { createInterface } from "node:readline";

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
    const text = process.env.NODE_COMPILE_CACHE ?? "unset";
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
