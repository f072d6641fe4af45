// A third-party ACP client for kin: the official TypeScript SDK
// (`@agentclientprotocol/sdk`, its `/unstable` entrypoint, which carries the subagent types).
//
//   node client.mjs replay <kin binary> <replay scenario dir> <sessions dir> <cwd>
//   node client.mjs editor <kin binary> <sessions dir> <cwd> terminal|local
//
// `replay` spawns `kin acp` in replay mode, advertises `clientCapabilities.subagents`, runs
// initialize, session/new and one session/prompt (the first prompt of the scenario's input.json).
// `editor` spawns `kin acp --permission-mode ask` against a loopback OpenAI-compatible model this
// script serves, whose model writes a file (asked: the call is `pending` while the question is
// open, its location absolute) and runs a `bash` command that prints, waits and prints again:
// with `terminal` the client advertises `clientCapabilities.terminal` and implements
// `terminal/*` by spawning the process, and the call's content must embed the terminal; with
// `local` the command runs in kin and its live output must arrive as progress updates. Either
// way the script checks that the SDK parsed every `session/update` kin sent.
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
// the initialize, session/new and session/prompt results against the SDK's response schemas;
// kin's requests (permission, terminal/*) are validated against the SDK's request schemas.
//
// On success it prints one line of JSON: {"ok":true, ..., "kinds":{...}}.

import { spawn } from "node:child_process";
import { createServer } from "node:http";
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

const USAGE =
  "usage: node client.mjs replay <kin binary> <replay scenario dir> <sessions dir> <cwd>\n" +
  "       node client.mjs editor <kin binary> <sessions dir> <cwd> terminal|local\n";
const [mode, kinBin, ...rest] = process.argv.slice(2);
const [scenarioDir, sessionsDir, cwd] = mode === "replay" ? rest : [undefined, ...rest];
const terminalMode = mode === "editor" ? rest[2] : undefined;
if (
  !kinBin ||
  !sessionsDir ||
  !cwd ||
  !(mode === "replay" ? scenarioDir : ["terminal", "local"].includes(terminalMode))
) {
  process.stderr.write(USAGE);
  process.exit(2);
}
const useTerminal = terminalMode === "terminal";

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

let promptText = "Write a note, then run the check";
if (mode === "replay") {
  const input = JSON.parse(readFileSync(join(scenarioDir, "input.json"), "utf8"));
  const promptStep = (input.steps ?? []).find((step) => typeof step.text === "string" && /^prompt/.test(step.op));
  if (!promptStep) {
    fail(`${join(scenarioDir, "input.json")} has no prompt step with a text`);
  }
  promptText = promptStep.text;
}

// The editor mode's model: a loopback Chat Completions server answering, in turn, a `write`
// call, a `bash` call and a final text.
const BASH_COMMAND = "echo live-one; sleep 1.5; echo live-two";
function sse(delta, finish) {
  return `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
}
function toolCall(id, name, args) {
  const call = { index: 0, id, type: "function", function: { name, arguments: JSON.stringify(args) } };
  return sse({ tool_calls: [call] }, null) + sse({}, "tool_calls");
}
const MODEL_ANSWERS = [
  toolCall("call_0", "write", { file_path: "note.txt", content: "noted\n" }),
  toolCall("call_1", "bash", { command: BASH_COMMAND, description: "Print, wait and print" }),
  sse({ role: "assistant", content: "Done." }, null) + sse({}, "stop"),
];
let modelCalls = 0;
let modelUrl;
let modelServer;
if (mode === "editor") {
  modelServer = createServer((request, response) => {
    request.resume();
    request.on("end", () => {
      const answer = MODEL_ANSWERS[Math.min(modelCalls, MODEL_ANSWERS.length - 1)];
      modelCalls += 1;
      response.writeHead(200, { "content-type": "text/event-stream" });
      response.end(answer + "data: [DONE]\n\n");
    });
  });
  await new Promise((resolve) => modelServer.listen(0, "127.0.0.1", resolve));
  modelUrl = `http://127.0.0.1:${modelServer.address().port}`;
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
const kinArgs =
  mode === "replay"
    ? ["acp", "--config", "/dev/null", "--permission-mode", "bypass", "--sessions", sessionsDir, "--replay", scenarioDir]
    : ["acp", "--config", "/dev/null", "--permission-mode", "ask", "--sessions", sessionsDir, "--model", "openai/gpt-test"];
if (mode === "editor") {
  env.OPENAI_BASE_URL = modelUrl;
  env.OPENAI_API_KEY = "sk-ts-client-test";
}
kin = spawn(kinBin, kinArgs, { cwd, env, stdio: ["pipe", "pipe", "inherit"] });
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

function checkRequest(name, schema, value) {
  const result = schema.safeParse(value);
  if (!result.success) {
    fail(
      `the SDK's ${name} schema rejects kin's request: ${describeIssues(result.error.issues).join("; ")}\n    sent: ${JSON.stringify(value)}`,
    );
  }
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
    checkRequest("RequestPermissionRequest", validate.zRequestPermissionRequest, params);
    // The call waits for this answer: kin must have said so before asking.
    const call = params.toolCall.toolCallId;
    const told = rawUpdates.filter((p) => p.update.toolCallId === call && p.update.status).map((p) => p.update.status);
    permissionRequests.push({ status: params.toolCall.status, toldBefore: told.at(-1) });
    const option = params.options.find((o) => o.kind === "allow_once") ?? params.options[0];
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  });

// The editor mode's terminals: real processes, stdout and stderr in one buffer, as a terminal.
const terminals = new Map();
const terminalCalls = [];
function terminal(params) {
  const term = terminals.get(params.terminalId);
  if (!term) throw new Error(`unknown terminal ${params.terminalId}`);
  return term;
}
function exitStatus(term) {
  return { exitCode: term.exit.code, signal: term.exit.signal };
}
if (useTerminal) {
  const t = acp.methods.client.terminal;
  app
    .onRequest(t.create, ({ params }) => {
      checkRequest("CreateTerminalRequest", validate.zCreateTerminalRequest, params);
      const terminalId = `term-${terminals.size + 1}`;
      terminalCalls.push({ method: "create", terminalId, params, embedded: embeddedTerminals() });
      const child = spawn(params.command, params.args ?? [], { cwd: params.cwd ?? cwd, stdio: ["ignore", "pipe", "pipe"] });
      const term = { child, output: "", exit: undefined, exited: undefined };
      term.exited = new Promise((resolve) =>
        child.on("exit", (code, signal) => {
          term.exit = { code, signal };
          resolve();
        }),
      );
      const limit = params.outputByteLimit ?? Infinity;
      for (const pipe of [child.stdout, child.stderr]) {
        pipe.on("data", (data) => {
          term.output = (term.output + data.toString()).slice(-limit);
        });
      }
      terminals.set(terminalId, term);
      return { terminalId };
    })
    .onRequest(t.waitForExit, async ({ params }) => {
      checkRequest("WaitForTerminalExitRequest", validate.zWaitForTerminalExitRequest, params);
      const term = terminal(params);
      terminalCalls.push({ method: "wait_for_exit", terminalId: params.terminalId, embedded: embeddedTerminals() });
      await term.exited;
      return exitStatus(term);
    })
    .onRequest(t.output, ({ params }) => {
      checkRequest("TerminalOutputRequest", validate.zTerminalOutputRequest, params);
      const term = terminal(params);
      terminalCalls.push({ method: "output", terminalId: params.terminalId });
      return { output: term.output, truncated: false, exitStatus: term.exit ? exitStatus(term) : undefined };
    })
    .onRequest(t.kill, ({ params }) => {
      checkRequest("KillTerminalRequest", validate.zKillTerminalRequest, params);
      terminal(params).child.kill("SIGKILL");
      terminalCalls.push({ method: "kill", terminalId: params.terminalId });
      return {};
    })
    .onRequest(t.release, ({ params }) => {
      checkRequest("ReleaseTerminalRequest", validate.zReleaseTerminalRequest, params);
      const term = terminal(params);
      if (!term.exit) term.child.kill("SIGKILL");
      terminals.delete(params.terminalId);
      terminalCalls.push({ method: "release", terminalId: params.terminalId });
      return {};
    });
}

// The terminal ids the calls' content embedded so far.
function embeddedTerminals() {
  return rawUpdates.flatMap((p) => (p.update.content ?? []).filter((c) => c.type === "terminal").map((c) => c.terminalId));
}

let stopReason;
let sessionId;
try {
  await app.connectWith(stream, async (ctx) => {
    const init = await ctx.request(acp.methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: {
        fs: { readTextFile: false, writeTextFile: false },
        terminal: useTerminal,
        ...(mode === "replay" ? { subagents: {} } : {}),
      },
      clientInfo: { name: "kin-ts-sdk-test", version: "0.0.0" },
    });
    checkResponse("InitializeResponse", validate.zInitializeResponse, init);
    const session = await ctx.request(acp.methods.agent.session.new, { cwd, mcpServers: [] });
    checkResponse("NewSessionResponse", validate.zNewSessionResponse, session);
    sessionId = session.sessionId;
    const response = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId,
      prompt: [{ type: "text", text: promptText }],
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
modelServer?.close();

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
if (mode === "editor") {
  problems.push(...editorProblems());
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
    terminalCalls: terminalCalls.map((c) => c.method),
  }),
);

// What the editor mode must have seen besides valid updates.
function editorProblems() {
  const found = [];
  const updates = rawUpdates.map((p) => p.update);
  const ofCall = (id) => updates.filter((u) => u.toolCallId === id);
  const text = (u) => (u.content ?? []).map((c) => c.content?.text ?? "").join("");
  // The write: an absolute location, `pending` while its question is open.
  const write = ofCall("call_0").find((u) => u.sessionUpdate === "tool_call");
  const path = write?.locations?.[0]?.path ?? "";
  if (!path.startsWith("/") || !path.endsWith("/note.txt")) {
    found.push(`the write's location is not the absolute path of note.txt: ${JSON.stringify(write)}`);
  }
  // Mode ask: the write and the command are both asked about, each while its call is pending.
  const pending = permissionRequests.filter((asked) => asked.status === "pending" && asked.toldBefore === "pending");
  if (permissionRequests.length !== 2 || pending.length !== 2) {
    found.push(`two questions, each asked while its call is pending: ${JSON.stringify(permissionRequests)}`);
  }
  if (readFileSync(join(cwd, "note.txt"), "utf8") !== "noted\n") {
    found.push("the allowed write did not happen");
  }
  // The command: its result is its whole output.
  const bash = ofCall("call_1");
  const result = bash.find((u) => u.status === "completed");
  if (text(result ?? {}) !== "live-one\nlive-two\n") {
    found.push(`the command's result is not its output: ${JSON.stringify(result)}`);
  }
  const done = bash.indexOf(result);
  if (useTerminal) {
    const methods = terminalCalls.map((c) => c.method).join(",");
    if (methods !== "create,wait_for_exit,output,release") {
      found.push(`terminal requests ${methods}, not create,wait_for_exit,output,release`);
    }
    const waited = terminalCalls.find((c) => c.method === "wait_for_exit");
    if (!waited?.embedded.includes("term-1")) {
      found.push(`the call did not show the terminal before kin waited for its exit: ${JSON.stringify(terminalCalls)}`);
    }
    const shown = bash.findIndex((u) => (u.content ?? []).some((c) => c.type === "terminal" && c.terminalId === "term-1"));
    if (shown < 0 || shown > done) {
      found.push(`no terminal content on the call before its result: ${JSON.stringify(bash)}`);
    }
    if (terminals.size !== 0) {
      found.push(`${terminals.size} terminal(s) never released`);
    }
  } else {
    if (terminalCalls.length !== 0 || agentRequests.some((m) => m.startsWith("terminal/"))) {
      found.push(`a client without terminals was sent terminal requests: ${JSON.stringify(agentRequests)}`);
    }
    // Live output: a status-less update showing the first line before the command ended.
    const live = bash.findIndex((u) => u.sessionUpdate === "tool_call_update" && !u.status && text(u).includes("live-one") && !text(u).includes("live-two"));
    if (live < 0 || live > done) {
      found.push(`no live output before the command ended: ${JSON.stringify(bash)}`);
    }
  }
  return found;
}
