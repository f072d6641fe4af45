#!/usr/bin/env python3
"""scripts/startup-order.py TRACER KIN MAP ORDER KEY (run by scripts/startup-order.sh): runs KIN under
TRACER through `initialize`, `session/new` and one prompt answered by a loopback Chat Completions
server, then writes to ORDER the functions it ran, in the order they first ran, named as the
linker map MAP names their sections (one function per section), after a first line `# key KEY`
(the linker skips lines that start with #)."""
import bisect
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

tracer, kin, link_map, order, key = sys.argv[1:6]
BODY = (b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
# Names longer than this (deeply nested generic types) are left out: they would make the file
# megabytes long for a handful of functions.
LONGEST = 1000


class Model(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Model)
threading.Thread(target=server.serve_forever, daemon=True).start()
work = tempfile.mkdtemp()
trace = os.path.join(work, "trace")
env = dict(os.environ, DEEPSEEK_BASE_URL=f"http://127.0.0.1:{server.server_port}", DEEPSEEK_API_KEY="trace",
           TRACE_OUT=trace)
env.pop("RUST_LOG", None)
agent = subprocess.Popen([tracer, kin, "acp", "--config", "/dev/null", "--sessions", os.path.join(work, "sessions")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=work)


def call(id, method, params):
    agent.stdin.write((json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}) + "\n").encode())
    agent.stdin.flush()
    while True:
        line = agent.stdout.readline()
        if not line:
            sys.exit(f"kin exited before answering {method}")
        message = json.loads(line)
        if message.get("id") == id and "method" not in message:
            if "error" in message:
                sys.exit(f"{method} failed: {message['error']}")
            return message["result"]


call(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
session = call(2, "session/new", {"cwd": work, "mcpServers": []})["sessionId"]
call(3, "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]})
agent.stdin.close()
agent.wait()

# The map's input sections of the code: "VMA LMA SIZE ALIGN file:(.text.NAME)", where LLVM may
# have put a prefix before NAME (.text.unlikely.NAME for a function it thinks cold).
sections = []
for line in open(link_map):
    fields = line.split()
    if len(fields) == 5 and ":(.text." in fields[4]:
        name = re.search(r":\(\.text\.(?:(?:unlikely|hot|startup|exit|split)\.)?(.+)\)$", fields[4])
        if name:
            sections.append((int(fields[0], 16), int(fields[2], 16), name.group(1)))
sections.sort()
starts = [s[0] for s in sections]
points = sorted((int(step), int(offset, 16)) for step, offset in (line.split() for line in open(trace)))
names, seen = [], set()
for _, offset in points:
    i = bisect.bisect_right(starts, offset) - 1
    if i >= 0 and offset < starts[i] + sections[i][1]:
        name = sections[i][2]
        if name not in seen:
            seen.add(name)
            names.append(name)
kept = [n for n in names if len(n) <= LONGEST]
with open(order, "w") as out:
    out.write(f"# key {key}\n" + "".join(n + "\n" for n in kept))
print(f"{order}: {len(kept)} functions ({len(names) - len(kept)} with names over {LONGEST} characters left out)")
