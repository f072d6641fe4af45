// bench/peers.mjs: kin and peer ACP agents side by side (run by bench/peers.sh, which installs
// the peers). One loopback model server answers Chat Completions (kin), Responses (codex-acp) and
// Anthropic Messages (claude-agent-acp) with the same one-word streamed answer. Each round runs
// every agent once, in a rotated order (paired and interleaved): start the process, time the
// `initialize` response (cold start), read the RSS of its process tree, open a session, send a
// one-line prompt and time the first `agent_message_chunk` and the prompt response, then read
// the RSS again and stop the process. Prints medians and, per peer, kin/peer ratios pair by pair.
//
// Usage: node bench/peers.mjs ROUNDS AGENT... where AGENT is NAME=JSON ({"cmd", "args", "env"};
// env values may contain @URL@, replaced by the model server's base URL, and @HOME@, a fresh
// home directory per run). The first agent is the reference (kin). PEERS_TRACE=1 prints every
// line the agents write (to stderr).

import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ANSWER = "hello";
const requests = new Map();

function sse(res, events) {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const [name, data] of events) {
    if (name) res.write(`event: ${name}\n`);
    res.write(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
  }
  res.end();
}

function chat(res) {
  sse(res, [
    [null, { id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { role: "assistant", content: ANSWER }, finish_reason: null }] }],
    [null, { id: "c1", object: "chat.completion.chunk", choices: [{ index: 0, delta: {}, finish_reason: "stop" }], usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 } }],
    [null, "[DONE]"],
  ]);
}

function responses(res) {
  const item = { type: "message", id: "msg_1", role: "assistant", status: "completed", content: [{ type: "output_text", text: ANSWER, annotations: [] }] };
  const response = { id: "resp_1", object: "response", status: "completed", output: [item], usage: { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 1, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 11 } };
  sse(res, [
    ["response.created", { type: "response.created", response: { ...response, status: "in_progress", output: [] } }],
    ["response.output_item.added", { type: "response.output_item.added", output_index: 0, item: { ...item, status: "in_progress", content: [] } }],
    ["response.output_text.delta", { type: "response.output_text.delta", item_id: "msg_1", output_index: 0, content_index: 0, delta: ANSWER }],
    ["response.output_item.done", { type: "response.output_item.done", output_index: 0, item }],
    ["response.completed", { type: "response.completed", response }],
  ]);
}

function messages(res) {
  const message = { id: "msg_1", type: "message", role: "assistant", model: "claude-sonnet-4-5", content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 10, output_tokens: 1 } };
  sse(res, [
    ["message_start", { type: "message_start", message }],
    ["content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } }],
    ["content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: ANSWER } }],
    ["content_block_stop", { type: "content_block_stop", index: 0 }],
    ["message_delta", { type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: 1 } }],
    ["message_stop", { type: "message_stop" }],
  ]);
}

function serve() {
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      const path = req.url.split("?")[0];
      const key = `${req.method} ${path}`;
      requests.set(key, (requests.get(key) ?? 0) + 1);
      if (req.method === "POST" && path.endsWith("/chat/completions")) return chat(res);
      if (req.method === "POST" && path.endsWith("/responses")) return responses(res);
      if (req.method === "POST" && path.endsWith("/messages/count_tokens")) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ input_tokens: 10 }));
      }
      if (req.method === "POST" && path.endsWith("/messages")) {
        let stream = true;
        try {
          stream = JSON.parse(body).stream !== false;
        } catch {}
        if (stream) return messages(res);
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ id: "msg_1", type: "message", role: "assistant", model: "claude-sonnet-4-5", content: [{ type: "text", text: ANSWER }], stop_reason: "end_turn", stop_sequence: null, usage: { input_tokens: 10, output_tokens: 1 } }));
      }
      if (req.method === "GET" && path.endsWith("/models")) {
        res.writeHead(200, { "content-type": "application/json" });
        return res.end(JSON.stringify({ data: [], models: [] }));
      }
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { type: "not_found", message: `${key} is not served by the bench model` } }));
    });
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

/// VmRSS of `pid` and every descendant, in KiB.
function treeRss(pid) {
  const children = new Map();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (!children.has(ppid)) children.set(ppid, []);
      children.get(ppid).push(Number(entry));
    } catch {}
  }
  let total = 0;
  const stack = [pid];
  while (stack.length) {
    const p = stack.pop();
    try {
      const line = readFileSync(`/proc/${p}/status`, "utf8").split("\n").find((l) => l.startsWith("VmRSS:"));
      total += line ? Number(line.split(/\s+/)[1]) : 0;
    } catch {}
    stack.push(...(children.get(p) ?? []));
  }
  return total;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// One run of an agent: cold start, RSS after initialize, first chunk, response, RSS after the turn.
async function runOnce(agent, url) {
  const home = mkdtempSync(join(tmpdir(), "kin-peers-home-"));
  const cwd = join(home, "work");
  mkdirSync(cwd);
  const env = { ...process.env };
  for (const [k, v] of Object.entries(agent.env ?? {})) env[k] = v.replaceAll("@URL@", url).replaceAll("@HOME@", home);
  for (const [file, text] of Object.entries(agent.files ?? {})) {
    const path = join(home, file);
    mkdirSync(join(path, ".."), { recursive: true });
    writeFileSync(path, text.replaceAll("@URL@", url).replaceAll("@HOME@", home));
  }
  const args = (agent.args ?? []).map((a) => a.replaceAll("@URL@", url).replaceAll("@HOME@", home));
  const started = process.hrtime.bigint();
  const child = spawn(agent.cmd, args, { env, cwd, stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (c) => (stderr = (stderr + c).slice(-4000)));
  const pending = new Map();
  let nextId = 1;
  let firstChunk = null;
  let buffer = "";
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  exited.then(({ code, signal }) => {
    for (const { reject } of pending.values()) reject(new Error(`${agent.name} exited (${code ?? signal}): ${stderr.trim().slice(-1500)}`));
    pending.clear();
  });
  child.stdout.on("data", (c) => {
    buffer += c;
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (!line.trim()) continue;
      if (process.env.PEERS_TRACE) console.error(`${agent.name} > ${line.slice(0, 400)}`);
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        continue;
      }
      if (msg.id !== undefined && msg.method === undefined) {
        const p = pending.get(msg.id);
        pending.delete(msg.id);
        if (p) msg.error ? p.reject(new Error(`${p.method}: ${JSON.stringify(msg.error)}`)) : p.resolve(msg.result);
      } else if (msg.method === "session/update") {
        // The first chunk of the model's answer (codex-acp sends a notice chunk before it).
        const update = msg.params?.update;
        if (update?.sessionUpdate === "agent_message_chunk" && update.content?.text?.includes(ANSWER) && firstChunk === null)
          firstChunk = process.hrtime.bigint();
      } else if (msg.method === "session/request_permission" && msg.id !== undefined) {
        const option = msg.params.options.find((o) => o.kind?.startsWith("allow")) ?? msg.params.options[0];
        send({ jsonrpc: "2.0", id: msg.id, result: { outcome: { outcome: "selected", optionId: option.optionId } } });
      } else if (msg.id !== undefined) {
        send({ jsonrpc: "2.0", id: msg.id, error: { code: -32601, message: "the bench client does not serve this" } });
      }
    }
  });
  function send(msg) {
    child.stdin.write(JSON.stringify(msg) + "\n");
  }
  function call(method, params, timeoutMs = 60000) {
    const id = nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${agent.name}: ${method} took over ${timeoutMs} ms; stderr: ${stderr.trim().slice(-1500)}`)), timeoutMs);
      pending.set(id, { method, resolve: (v) => (clearTimeout(timer), resolve(v)), reject: (e) => (clearTimeout(timer), reject(e)) });
      send({ jsonrpc: "2.0", id, method, params });
    });
  }
  const ms = (t) => Number(t - started) / 1e6;
  try {
    await call("initialize", { protocolVersion: 1, clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false } });
    const cold = ms(process.hrtime.bigint());
    await sleep(100);
    const rssInit = treeRss(child.pid);
    const session = await call("session/new", { cwd, mcpServers: [] });
    const sent = process.hrtime.bigint();
    const answer = await call("session/prompt", { sessionId: session.sessionId, prompt: [{ type: "text", text: "Say hello." }] });
    const done = process.hrtime.bigint();
    if (firstChunk === null) throw new Error(`${agent.name}: the turn ended (${JSON.stringify(answer)}) without an agent_message_chunk holding the answer`);
    const rssTurn = treeRss(child.pid);
    return { cold, rssInit, first: Number(firstChunk - sent) / 1e6, response: Number(done - sent) / 1e6, rssTurn };
  } finally {
    child.stdin.end();
    const stop = setTimeout(() => child.kill("SIGKILL"), 3000);
    child.kill("SIGTERM");
    await exited;
    clearTimeout(stop);
    rmSync(home, { recursive: true, force: true });
  }
}

const median = (v) => {
  const s = [...v].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const FIGURES = [
  ["cold", "cold start to initialize", "ms"],
  ["rssInit", "RSS after initialize (process tree)", "MiB"],
  ["first", "prompt to first chunk", "ms"],
  ["response", "prompt to response", "ms"],
  ["rssTurn", "RSS after the turn (process tree)", "MiB"],
];
const show = (v, unit) => (unit === "MiB" ? `${(v / 1024).toFixed(1)} MiB` : `${v.toFixed(1)} ms`);

async function main() {
  const [roundsArg, ...specs] = process.argv.slice(2);
  const rounds = Number(roundsArg);
  const agents = specs.map((s) => {
    const eq = s.indexOf("=");
    return { name: s.slice(0, eq), ...JSON.parse(s.slice(eq + 1)) };
  });
  const server = await serve();
  const url = `http://127.0.0.1:${server.address().port}`;
  const samples = new Map(agents.map((a) => [a.name, []]));
  const failed = new Map();
  // A warm-up run each (page cache, npm's first-run work), not counted.
  for (const agent of agents) {
    try {
      await runOnce(agent, url);
    } catch (e) {
      failed.set(agent.name, e.message);
      console.log(`skipped ${agent.name}: its warm-up run failed: ${e.message}`);
    }
  }
  const live = agents.filter((a) => !failed.has(a.name));
  for (let round = 0; round < rounds; round++) {
    const order = live.map((_, i) => live[(i + round) % live.length]);
    for (const agent of order) {
      try {
        samples.get(agent.name).push(await runOnce(agent, url));
      } catch (e) {
        samples.get(agent.name).push(null);
        console.log(`round ${round + 1}: ${agent.name} failed: ${e.message.slice(0, 300)}`);
      }
    }
  }
  server.close();
  console.log(`\n${rounds} rounds, agents in rotated order; medians (model requests served: ${JSON.stringify(Object.fromEntries(requests))})`);
  for (const agent of live) {
    const ok = samples.get(agent.name).filter(Boolean);
    if (!ok.length) continue;
    console.log(`${agent.name.padEnd(18)} ${FIGURES.map(([k, label, unit]) => `${label} ${show(median(ok.map((s) => s[k])), unit)}`).join("; ")}`);
  }
  const [reference, ...peers] = live;
  for (const peer of peers) {
    console.log(`\nkin/${peer.name}, pair by pair (round: ${FIGURES.map(([, label]) => label).join(" | ")}); median of the pair ratios last`);
    const ratios = FIGURES.map(() => []);
    samples.get(reference.name).forEach((k, i) => {
      const p = samples.get(peer.name)[i];
      if (!k || !p) return;
      const r = FIGURES.map(([key], j) => {
        const ratio = k[key] / p[key];
        ratios[j].push(ratio);
        return `${ratio.toFixed(2)}x`;
      });
      console.log(`  round ${String(i + 1).padStart(2)}: ${r.join(" | ")}`);
    });
    if (ratios[0].length) console.log(`  median  : ${ratios.map((r) => `${median(r).toFixed(2)}x`).join(" | ")}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
