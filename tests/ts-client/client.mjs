// A third-party ACP client for kin: the official TypeScript SDK
// (`@agentclientprotocol/sdk`, its `/unstable` entrypoint, which carries the subagent types).
//
//   node client.mjs <kin binary> <replay scenario dir> <sessions dir> <cwd>
//
// Spawns `kin acp` in replay mode, advertises `clientCapabilities.subagents`, runs initialize,
// session/new and one session/prompt (the first prompt of the scenario's input.json), and checks
// that the SDK parsed every `session/update` kin sent.
//
// How a bad update is caught: the SDK's client app validates every incoming `session/update`
// with its generated zod schema (`zSessionNotification`, a closed union of the known
// `sessionUpdate` kinds) before any handler runs. A value that fails is NOT delivered: the SDK
// logs "Error handling notification" to console.error and drops it. So this script
//   1. taps the raw message stream and counts every `session/update` kin wrote,
//   2. counts the updates the SDK delivered to the typed handler,
//   3. validates each raw update itself with the SDK's own `zSessionNotification` to name the
//      exact zod issues, and checks its kind against the SDK's unstable JSON schema,
//   4. records every "Error handling notification" the SDK logs,
// and fails when the counts differ, any raw update is invalid or of an unknown kind, or the SDK
// logged a notification error. The SDK does not validate responses, so the script also checks
// the initialize, session/new and session/prompt results against the SDK's response schemas.
//
// On success it prints one line of JSON: {"ok":true, ..., "kinds":{...}}.

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";

import * as acp from "@agentclientprotocol/sdk/unstable";

const TIMEOUT_MS = 60_000;

let kin;

function fail(message) {
  process.stderr.write(`ts-client: FAIL: ${message}\n`);
  process.exitCode = 1;
  if (kin && kin.exitCode === null && kin.signalCode === null) {
    kin.kill("SIGKILL");
  }
  process.exit(1);
}

const [kinBin, scenarioDir, sessionsDir, cwd] = process.argv.slice(2);
if (!kinBin || !scenarioDir || !sessionsDir || !cwd) {
  process.stderr.write("usage: node client.mjs <kin binary> <replay scenario dir> <sessions dir> <cwd>\n");
  process.exit(2);
}

// The SDK's own schemas: the generated zod validators the `/unstable` entrypoint uses, and its
// unstable v1 JSON schema (a public export) for the list of known update kinds.
const entryUrl = import.meta.resolve("@agentclientprotocol/sdk/unstable");
const validate = await import(new URL("./schema/zod.gen.js", entryUrl).href);
const sdkPackage = JSON.parse(readFileSync(fileURLToPath(new URL("../../../package.json", entryUrl)), "utf8"));
const jsonSchema = JSON.parse(
  readFileSync(fileURLToPath(import.meta.resolve("@agentclientprotocol/sdk/schema/v1/schema.unstable.json")), "utf8"),
);
const defs = jsonSchema.$defs ?? jsonSchema.definitions;
const KNOWN_KINDS = new Set(defs.SessionUpdate.oneOf.map((variant) => variant.properties.sessionUpdate.const));
const CLIENT_METHODS = new Set(Object.values(acp.CLIENT_METHODS));
if (!KNOWN_KINDS.has("subagent_update")) {
  fail(`SDK ${sdkPackage.version} has no subagent_update in its unstable schema`);
}

const input = JSON.parse(readFileSync(join(scenarioDir, "input.json"), "utf8"));
const promptStep = (input.steps ?? []).find((step) => typeof step.text === "string" && /^prompt/.test(step.op));
if (!promptStep) {
  fail(`${join(scenarioDir, "input.json")} has no prompt step with a text`);
}

// The SDK reports a notification it could not parse only through console.error.
const sdkErrors = [];
const consoleError = console.error.bind(console);
console.error = (...args) => {
  if (args[0] === "Error handling notification") {
    sdkErrors.push(args[1]);
  }
  consoleError(...args);
};

const env = { ...process.env };
for (const key of Object.keys(env)) {
  if (key.startsWith("KIN_")) delete env[key];
}
kin = spawn(
  kinBin,
  ["acp", "--config", "/dev/null", "--permission-mode", "bypass", "--sessions", sessionsDir, "--replay", scenarioDir],
  { cwd, env, stdio: ["pipe", "pipe", "inherit"] },
);
const kinExited = new Promise((resolve) => kin.on("exit", (code, signal) => resolve({ code, signal })));
kin.on("error", (error) => fail(`could not start ${kinBin}: ${error.message}`));
const timer = setTimeout(() => fail(`timed out after ${TIMEOUT_MS} ms`), TIMEOUT_MS);

// Everything kin writes, as the SDK's line decoder produced it, before the SDK dispatches it.
const rawUpdates = [];
const otherNotifications = [];
const agentRequests = [];
const base = acp.ndJsonStream(Writable.toWeb(kin.stdin), Readable.toWeb(kin.stdout));
const tap = new TransformStream({
  transform(message, controller) {
    if (typeof message.method === "string") {
      if (message.id !== undefined) {
        agentRequests.push(message.method);
      } else if (message.method === acp.methods.client.session.update) {
        rawUpdates.push(message.params);
      } else {
        otherNotifications.push(message.method);
      }
    }
    controller.enqueue(message);
  },
});
const stream = { readable: base.readable.pipeThrough(tap), writable: base.writable };

// What the SDK delivered after its own validation.
const delivered = [];
const permissionRequests = [];

// Zod reports a failed union with the issues of every variant; keep only the variant whose
// discriminant matched, so the message names the field that actually failed.
const TAG_KEYS = new Set(["sessionUpdate", "type", "state", "outcome", "kind"]);
function describeIssues(issues, prefix = []) {
  const lines = [];
  for (const issue of issues) {
    const path = [...prefix, ...issue.path];
    if (issue.code === "invalid_union" && Array.isArray(issue.errors)) {
      const matching = issue.errors.filter(
        (branch) => !branch.some((i) => i.code === "invalid_value" && i.path.length === 1 && TAG_KEYS.has(i.path[0])),
      );
      if (matching.length === 1) {
        lines.push(...describeIssues(matching[0], path));
        continue;
      }
      lines.push(`${path.join(".") || "(root)"}: matches no variant of the union`);
      continue;
    }
    lines.push(`${path.join(".") || "(root)"}: ${issue.message}`);
  }
  return lines;
}

function checkResponse(name, schema, value) {
  const result = schema.safeParse(value);
  if (!result.success) {
    fail(
      `the SDK's ${name} schema rejects kin's response: ${describeIssues(result.error.issues).join("; ")}\n    sent: ${JSON.stringify(value)}`,
    );
  }
}

const app = acp
  .client({ name: "kin-ts-sdk-test" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    delivered.push(params);
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    permissionRequests.push(params);
    const option = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  });

let stopReason;
let sessionId;
try {
  await app.connectWith(stream, async (ctx) => {
    const init = await ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false, subagents: {} },
      clientInfo: { name: "kin-ts-sdk-test", version: "0.0.0" },
    });
    checkResponse("InitializeResponse", validate.zInitializeResponse, init);
    const session = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    checkResponse("NewSessionResponse", validate.zNewSessionResponse, session);
    sessionId = session.sessionId;
    const response = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId,
      prompt: [{ type: "text", text: promptStep.text }],
    });
    checkResponse("PromptResponse", validate.zPromptResponse, response);
    stopReason = response.stopReason;
    // Notifications are dispatched asynchronously; the connection drops unprocessed ones when it
    // closes, so wait until every raw update has either been delivered or shown to be invalid.
    const deadline = Date.now() + 5_000;
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      const invalid = rawUpdates.filter((p) => !validate.zSessionNotification.safeParse(p).success).length;
      if (delivered.length + invalid >= rawUpdates.length) break;
      if (Date.now() > deadline) break;
    }
  });
} catch (error) {
  fail(`the SDK client failed: ${error?.stack ?? error}${error?.data ? ` ${JSON.stringify(error.data)}` : ""}`);
}

// Close kin's stdin and wait for it to exit.
kin.stdin.end();
const exit = await kinExited;
clearTimeout(timer);

const problems = [];
rawUpdates.forEach((params, index) => {
  const kind = params?.update?.sessionUpdate;
  if (!KNOWN_KINDS.has(kind)) {
    problems.push(`update #${index} has unknown kind ${JSON.stringify(kind)}: ${JSON.stringify(params)}`);
  }
  const result = validate.zSessionNotification.safeParse(params);
  if (!result.success) {
    problems.push(
      `update #${index} (${kind}) fails the SDK schema: ${describeIssues(result.error.issues).join("; ")}\n    sent: ${JSON.stringify(params)}`,
    );
  }
});
for (const error of sdkErrors) {
  problems.push(`the SDK dropped a notification: ${JSON.stringify(error)}`);
}
if (delivered.length !== rawUpdates.length) {
  problems.push(`kin sent ${rawUpdates.length} session/update notifications but the SDK delivered ${delivered.length}`);
}
for (const method of otherNotifications) {
  if (!CLIENT_METHODS.has(method) && !method.startsWith("_")) {
    problems.push(`kin sent a notification the SDK does not know: ${method}`);
  }
}
if (stopReason !== "end_turn") {
  problems.push(`the prompt ended with stopReason ${JSON.stringify(stopReason)}, not "end_turn"`);
}
if (exit.code !== 0) {
  problems.push(`kin exited with ${exit.signal ? `signal ${exit.signal}` : `code ${exit.code}`} after stdin closed`);
}
if (problems.length > 0) {
  fail(`${problems.length} problem(s) with kin's traffic:\n  - ${problems.join("\n  - ")}`);
}

const kinds = { subagent_update: 0, tool_call: 0, agent_message_chunk: 0 };
for (const params of delivered) {
  kinds[params.update.sessionUpdate] = (kinds[params.update.sessionUpdate] ?? 0) + 1;
}
const sessions = new Set(delivered.map((params) => params.sessionId));
console.log(
  JSON.stringify({
    ok: true,
    sdk: sdkPackage.version,
    stopReason,
    updates: delivered.length,
    sessions: sessions.size,
    permissionRequests: permissionRequests.length,
    agentRequests,
    otherNotifications,
    kinds,
  }),
);
