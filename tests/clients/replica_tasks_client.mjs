// Two replicas of `sandbox-runtime serve --http` behind one load balancer, as the TypeScript MCP SDK's client sees
// them: a long run_python started as a task (2025-11-25) on replica A, then read, listed and cancelled on
// replica B; A's stream ends with the cancel, and B gives the task's result.
//
// argv[2]: JSON {a: url, b: url, code: "...", timeout_ms: N}
// Once the task is created it prints {"created": taskId} and waits for a line on stdin (the test says when the run
// is under way). The last line on stdout is the report, as JSON.
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const sdk = join(repo, ".npm-tools", "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm");
const { Client } = await import(pathToFileURL(join(sdk, "client", "index.js")).href);
const { StreamableHTTPClientTransport } = await import(pathToFileURL(join(sdk, "client", "streamableHttp.js")).href);
const { CallToolResultSchema } = await import(pathToFileURL(join(sdk, "types.js")).href);

const request = JSON.parse(process.argv[2]);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const options = { timeout: request.timeout_ms, task: { ttl: 600000 } };

async function connected(url, name) {
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

const a = await connected(request.a, "replica-a-client");
const b = await connected(request.b, "replica-b-client");
const report = { statuses: [] };
try {
  const stream = a.experimental.tasks.callToolStream(
    { name: "run_python", arguments: { code: request.code } },
    CallToolResultSchema,
    options,
  );
  for await (const message of stream) {
    if (message.task) report.statuses.push(message.task.status);
    if (message.type === "error") report.stream_error = String(message.error?.message ?? message.error);
    if (message.type === "result") report.result = message.result;
    if (message.type === "taskCreated") {
      report.created = message.task.taskId;
      console.log(JSON.stringify({ created: report.created }));
      await lines.next();
      report.b_get = await b.experimental.tasks.getTask(report.created, options);
      report.b_listed = (await b.experimental.tasks.listTasks(undefined, options)).tasks.map((t) => t.taskId);
      report.b_cancelled = await b.experimental.tasks.cancelTask(report.created, options);
    }
  }
  report.a_after = await a.experimental.tasks.getTask(report.created, options);
  report.b_payload = await b.experimental.tasks.getTaskResult(report.created, CallToolResultSchema, options);
} catch (error) {
  report.failure = String(error?.stack ?? error);
}
console.log(JSON.stringify(report));
await a.close();
await b.close();
process.exit(0);
