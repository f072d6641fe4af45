#!/usr/bin/env bash
# bench/peers.sh: kin and its peers side by side on this machine. Installs codex-acp and
# claude-agent-acp from npm into a temporary directory (removed at exit) and runs kin and each
# peer in turn, paired and interleaved, against one loopback model server (bench/peers.mjs):
# cold start to `initialize`, RSS after it, one turn's first chunk and response time, RSS after
# the turn; medians, and kin/peer ratios pair by pair. A peer that cannot be installed or run is
# skipped, saying why. Needs a kin binary (a release build: `cargo build --release`).
#
# Usage: bench/peers.sh [ROUNDS] (default 10). KIN=path picks the kin binary (default
# target/release/kin); CODEX_ACP_VERSION and CLAUDE_AGENT_ACP_VERSION pick the peers' versions.
set -euo pipefail

rounds=${1:-10}
here=$(cd "$(dirname "$0")" && pwd)
kin=${KIN:-$here/../target/release/kin}
codex_version=${CODEX_ACP_VERSION:-0.16.0}
claude_version=${CLAUDE_AGENT_ACP_VERSION:-0.101.0}

if [[ ! -x $kin ]]; then
  echo "peers.sh: no kin binary at $kin: run \`cargo build --release\` first, or set KIN=path" >&2
  exit 2
fi
if ! command -v node >/dev/null; then
  echo "peers.sh: Node is not installed: the peers are npm packages and the driver is a Node script; nothing to compare" >&2
  exit 2
fi

json() { node -e 'process.stdout.write(JSON.stringify(JSON.parse(process.argv[1])))' "$1"; }
agents=("kin=$(json "{\"cmd\": \"$kin\", \"args\": [\"acp\", \"--config\", \"/dev/null\", \"--sessions\", \"@HOME@/sessions\"],
  \"env\": {\"DEEPSEEK_BASE_URL\": \"@URL@\", \"DEEPSEEK_API_KEY\": \"bench\", \"HOME\": \"@HOME@\"}}")")

dir=$(mktemp -d -t kin-peers.XXXXXX)
trap 'rm -rf "$dir"' EXIT
echo "kin bench peers — $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); node $(node --version)"
echo "kin: $kin ($("$kin" --version))"

install() { # NAME PACKAGE@VERSION: installs into $dir/NAME; says why not when it cannot
  if ! command -v npm >/dev/null; then
    echo "skipped $1: npm is not installed"
    return 1
  fi
  if ! out=$(npm install --prefix "$dir/$1" --no-audit --no-fund --loglevel=error "$2" 2>&1); then
    echo "skipped $1: \`npm install $2\` failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    return 1
  fi
  echo "installed $2"
}

# codex-acp (Rust, the platform binary run directly rather than through its Node launcher): a
# custom Responses provider on loopback, keyed by an environment variable, with a fresh
# CODEX_HOME per run.
if install codex-acp "@zed-industries/codex-acp@$codex_version"; then
  bin=$(ls "$dir"/codex-acp/node_modules/@zed-industries/codex-acp-linux-*/bin/codex-acp 2>/dev/null | head -n 1 || true)
  if [[ -z $bin ]]; then
    echo "skipped codex-acp: the package has no binary for this platform ($(uname -sm))"
  else
    agents+=("codex-acp=$(json "{\"cmd\": \"$bin\", \"args\": [\"-c\", \"model_provider=\\\"bench\\\"\", \"-c\", \"model=\\\"gpt-5\\\"\",
      \"-c\", \"model_providers.bench={name=\\\"bench\\\", base_url=\\\"@URL@/v1\\\", wire_api=\\\"responses\\\", env_key=\\\"BENCH_API_KEY\\\"}\"],
      \"env\": {\"CODEX_HOME\": \"@HOME@/codex\", \"BENCH_API_KEY\": \"bench\", \"HOME\": \"@HOME@\"}, \"files\": {\"codex/config.toml\": \"\"}}")")
  fi
fi

# claude-agent-acp (Node; starts the Claude Code binary per session): Anthropic Messages on
# loopback, no non-essential traffic. IS_SANDBOX=1 lets it run as root (the CLI refuses its
# permission bypass as root otherwise).
if install claude-agent-acp "@agentclientprotocol/claude-agent-acp@$claude_version"; then
  agents+=("claude-agent-acp=$(json "{\"cmd\": \"node\", \"args\": [\"$dir/claude-agent-acp/node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js\"],
    \"env\": {\"ANTHROPIC_BASE_URL\": \"@URL@\", \"ANTHROPIC_API_KEY\": \"bench\", \"HOME\": \"@HOME@\", \"CLAUDE_CONFIG_DIR\": \"@HOME@/claude\",
      \"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC\": \"1\", \"DISABLE_AUTOUPDATER\": \"1\", \"IS_SANDBOX\": \"1\"}}")")
fi

node "$here/peers.mjs" "$rounds" "${agents[@]}"
