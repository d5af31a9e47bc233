// Two tenants of one `sandbox-runtime serve --http` with OAuth, as the TypeScript MCP SDK's client sees them: a
// long run_python started as a task (2025-11-25) by tenant A, then tenant B tries every tasks/* method on its id,
// then A reads, lists and cancels it.
//
// argv[2]: JSON {url, a_token, b_token, code, timeout_ms}
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

async function connected(token, name) {
  const client = new Client({ name, version: "1.0.0" });
  const headers = { Authorization: `Bearer ${token}` };
  await client.connect(new StreamableHTTPClientTransport(new URL(request.url), { requestInit: { headers } }));
  return client;
}

async function attempt(work) {
  try {
    return { ok: await work() };
  } catch (error) {
    return { error: String(error?.message ?? error) };
  }
}

const a = await connected(request.a_token, "tenant-a-client");
const b = await connected(request.b_token, "tenant-b-client");
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
      report.b_get = await attempt(() => b.experimental.tasks.getTask(report.created, options));
      report.b_listed = await attempt(async () =>
        (await b.experimental.tasks.listTasks(undefined, options)).tasks.map((t) => t.taskId),
      );
      report.b_result = await attempt(() =>
        b.experimental.tasks.getTaskResult(report.created, CallToolResultSchema, { timeout: 5000 }),
      );
      report.b_cancel = await attempt(() => b.experimental.tasks.cancelTask(report.created, options));
      report.a_get = await attempt(() => a.experimental.tasks.getTask(report.created, options));
      report.a_listed = await attempt(async () =>
        (await a.experimental.tasks.listTasks(undefined, options)).tasks.map((t) => t.taskId),
      );
      report.a_cancel = await attempt(() => a.experimental.tasks.cancelTask(report.created, options));
    }
  }
} catch (error) {
  report.failure = String(error?.stack ?? error);
}
console.log(JSON.stringify(report));
await a.close();
await b.close();
process.exit(0);
