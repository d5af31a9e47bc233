// Drives `sandbox-runtime serve` over stdio with the TypeScript MCP SDK's client, calling run_python as a task.
//
// argv[2]: JSON {command: [...], env: {...}, code: "...", mode: "complete" | "cancel", timeout_ms: N}
// mode "complete": the task's stream to its end. mode "cancel": once the task is created, prints
// {"created": taskId} and waits for a line on stdin, then cancels the task (tasks/cancel); after its report it
// waits for another line before it closes the server. The last line on stdout is the report, as JSON.
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const sdk = join(repo, ".npm-tools", "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm");
const { Client } = await import(pathToFileURL(join(sdk, "client", "index.js")).href);
const { StdioClientTransport } = await import(pathToFileURL(join(sdk, "client", "stdio.js")).href);
const { CallToolResultSchema } = await import(pathToFileURL(join(sdk, "types.js")).href);

const request = JSON.parse(process.argv[2]);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const options = { timeout: request.timeout_ms, task: { ttl: 600000 } };

const client = new Client({ name: "tasks-client", version: "1.0.0" });
const transport = new StdioClientTransport({
  command: request.command[0],
  args: request.command.slice(1),
  env: request.env,
  stderr: "inherit",
});
await client.connect(transport);
const report = { capabilities: client.getServerCapabilities(), messages: [], statuses: [] };
try {
  const { tools } = await client.listTools();
  report.execution = Object.fromEntries(tools.map((tool) => [tool.name, tool.execution ?? null]));
  const stream = client.experimental.tasks.callToolStream(
    { name: "run_python", arguments: { code: request.code } },
    CallToolResultSchema,
    options,
  );
  for await (const message of stream) {
    const seen = { type: message.type };
    if (message.task) {
      seen.taskId = message.task.taskId;
      seen.status = message.task.status;
      report.statuses.push(message.task.status);
    }
    if (message.type === "result") report.result = message.result;
    if (message.type === "error") seen.error = String(message.error?.message ?? message.error);
    report.messages.push(seen);
    if (message.type === "taskCreated") {
      report.created = message.task;
      if (request.mode === "cancel") {
        console.log(JSON.stringify({ created: message.task.taskId }));
        await lines.next(); // the test says when the run is under way
        report.cancelled = await client.experimental.tasks.cancelTask(message.task.taskId, options);
        report.after_cancel = await client.experimental.tasks.getTask(message.task.taskId, options);
        report.listed = (await client.experimental.tasks.listTasks(undefined, options)).tasks;
      }
    }
  }
  if (report.created) {
    report.payload = await client.experimental.tasks.getTaskResult(report.created.taskId, CallToolResultSchema, options);
  }
} catch (error) {
  report.failure = String(error?.stack ?? error);
}
console.log(JSON.stringify(report));
if (request.mode === "cancel") await lines.next(); // the server stays up while the test looks in the sandbox
await client.close();
process.exit(0);
