// Drives `sandbox-runtime serve --http` in the 2026-07-28 era with the TypeScript client 2.x and the Tasks
// extension's own client library (@modelcontextprotocol/ext-tasks), calling run_python.
//
// argv[2]: JSON {url: "...", code: "...", mode: "complete" | "cancel", timeout_ms: N}
// mode "complete": the call to its end (an immediate result or a task), and what the server answers to task
// requests that break the extension's rules. mode "cancel": once the call became a task, prints
// {"created": taskId} and waits for a line on stdin, then cancels it; after its report it waits for another line
// before it exits. The last line on stdout is the report, as JSON.
//
// ext-tasks sends the extension's own requests (tools/call, tasks/*) through `rawDispatch`: here one JSON-RPC
// POST per request on the Streamable HTTP wire, with the headers the 2026-07-28 transport asks for.
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const modules = join(repo, ".npm-tools", "node_modules", "@modelcontextprotocol");
const { Client, StreamableHTTPClientTransport } = await import(
  pathToFileURL(join(modules, "client", "dist", "index.mjs")).href
);
const { createTaskSessionFromClient, resultFromTaskOutcome } = await import(
  pathToFileURL(join(modules, "ext-tasks", "dist", "client", "index.js")).href
);

const PROTOCOL = "2026-07-28";
const TASKS = "io.modelcontextprotocol/tasks";
const request = JSON.parse(process.argv[2]);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const clientInfo = { name: "tasks-v2-client", version: "1.0.0" };
let nextId = 1;

async function post(message, signal) {
  const headers = {
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-protocol-version": PROTOCOL,
    "mcp-method": message.method,
  };
  if (message.method.startsWith("tasks/")) headers["mcp-name"] = message.params.taskId;
  if (message.method === "tools/call") headers["mcp-name"] = message.params.name;
  const response = await fetch(request.url, { method: "POST", headers, body: JSON.stringify(message), signal });
  const body = await response.text();
  if ((response.headers.get("content-type") ?? "").includes("text/event-stream")) {
    // the answer is the SSE event whose data is the response to this id
    for (const block of body.split(/\r?\n\r?\n/)) {
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      const parsed = JSON.parse(data);
      if (parsed.id === message.id) return parsed;
    }
    throw new Error(`no response to request ${message.id} in the event stream: ${body.slice(0, 500)}`);
  }
  return JSON.parse(body);
}

async function rawDispatch(message, options = {}) {
  // ext-tasks hands over the request itself ({method, params}); the JSON-RPC envelope is the transport's
  const answer = await post({ jsonrpc: "2.0", id: `raw-${nextId++}`, ...message }, options.signal);
  return "error" in answer ? { kind: "error", error: answer.error } : { kind: "result", result: answer.result };
}

// a request sent by hand, framed as a 2026-07-28 request; `extensions` are its declared capabilities
function framed(method, params, extensions) {
  return {
    jsonrpc: "2.0",
    id: `check-${nextId++}`,
    method,
    params: {
      ...params,
      _meta: {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": clientInfo,
        "io.modelcontextprotocol/clientCapabilities": { extensions },
      },
    },
  };
}

const client = new Client(clientInfo, { versionNegotiation: { mode: { pin: PROTOCOL } } });
await client.connect(new StreamableHTTPClientTransport(new URL(request.url)));
const report = { era: client.getProtocolEra(), capabilities: client.getServerCapabilities(), events: [] };
const session = createTaskSessionFromClient(client, {
  endpointId: "sandbox-runtime-test",
  rawDispatch,
  v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities: {} },
});
try {
  const execution = await session.callTool(
    "run_python",
    { code: request.code },
    { requestTimeoutMs: request.timeout_ms },
  );
  report.kind = execution.kind;
  if (execution.kind === "task") report.taskId = execution.handle.taskId;
  if (request.mode === "cancel") {
    console.log(JSON.stringify({ created: report.taskId }));
    await lines.next(); // the test says when the run is under way
    await execution.cancel();
    report.after_cancel = await post(framed("tasks/get", { taskId: report.taskId }, { [TASKS]: {} }));
    report.cancel_again = await post(framed("tasks/cancel", { taskId: report.taskId }, { [TASKS]: {} }));
  } else {
    const { outcome } = await execution.settle({
      onEvent: (event) => {
        report.events.push(event.type === "task" ? event.task.status : `outcome:${event.outcome.status}`);
      },
    });
    report.result = resultFromTaskOutcome(outcome);
    if (report.taskId) {
      const id = report.taskId;
      report.get_again = await post(framed("tasks/get", { taskId: id }, { [TASKS]: {} }));
      report.update = await post(framed("tasks/update", { taskId: id, inputResponses: {} }, { [TASKS]: {} }));
      report.undeclared = await post(framed("tasks/get", { taskId: id }, {}));
      report.unknown = await post(framed("tasks/get", { taskId: "no-such-task" }, { [TASKS]: {} }));
      report.listed = await post(framed("tasks/list", {}, { [TASKS]: {} }));
      report.payload = await post(framed("tasks/result", { taskId: id }, { [TASKS]: {} }));
    }
  }
} catch (error) {
  report.failure = String(error?.stack ?? error);
}
console.log(JSON.stringify(report));
if (request.mode === "cancel") await lines.next(); // the server stays up while the test looks in the sandbox
await session.close();
await client.close();
process.exit(0);
