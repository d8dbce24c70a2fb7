#!/usr/bin/env bash
# Lists vigil's MCP tools with an MCP client that is not ours: the MCP
# Inspector's CLI mode (Node.js, the TypeScript SDK), over stdio against
# `vigil mcp` and over streamable HTTP against /mcp of `vigil serve`. Each
# listing must hold all six tools (DESIGN §7).
#
# Getting the client is best effort: without npm, or when the pinned package
# cannot be installed (offline, registry down) or does not run on this
# Node.js, it prints "skipped: <why>" and exits 0. Once the client runs,
# any failure — a connection refused, a missing tool — exits 1.
#
# Environment:
#   MCP_INSPECTOR_VERSION  the @modelcontextprotocol/inspector version (default below)
#   NPM_INSTALL_TIMEOUT    seconds the npm install may take (default 180)
set -euo pipefail
cd "$(dirname "$0")/.."

# 1.0.3 is the newest release that runs on Node.js 20 (2.x needs 22.19 or
# later); npm warns that it asks for Node 22 (EBADENGINE), which is harmless.
version=${MCP_INSPECTOR_VERSION:-1.0.3}
install_timeout=${NPM_INSTALL_TIMEOUT:-180}
tools=(agent_status fleet_snapshot list_agents list_process_events list_processes process_status)

work=$(mktemp -d)
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then
    kill "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

skip() {
  echo "skipped: $*"
  exit 0
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

command -v npm >/dev/null || skip "npm is not installed"
command -v node >/dev/null || skip "node is not installed"

echo "== installing @modelcontextprotocol/inspector@$version (at most ${install_timeout}s)"
if ! timeout "$install_timeout" npm install --prefix "$work/npm" --no-audit --no-fund --no-save --loglevel=error \
  "@modelcontextprotocol/inspector@$version" >"$work/npm.log" 2>&1; then
  tail -n 5 "$work/npm.log" >&2
  skip "npm could not install @modelcontextprotocol/inspector@$version (exit or timeout; log tail above)"
fi
inspector=$work/npm/node_modules/.bin/mcp-inspector
[ -x "$inspector" ] || skip "the package installed no mcp-inspector command"
timeout 60 "$inspector" --help >"$work/help.log" 2>&1 ||
  skip "mcp-inspector $version does not run on node $(node --version): $(tail -n 1 "$work/help.log")"

echo "== building vigil"
go build -o "$work/vigil" ./cmd/vigil

# check_tools TRANSPORT FILE: FILE is a tools/list answer; every tool must be in it.
check_tools() {
  local listed
  listed=$(node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const t of r.tools) console.log(t.name);
  ' "$2") || fail "$1: the answer is not a tools/list result: $(head -c 500 "$2")"
  for tool in "${tools[@]}"; do
    grep -qx "$tool" <<<"$listed" || fail "$1: tool $tool not listed; listed: $(echo $listed)"
  done
  echo "ok: $1 lists ${#tools[@]} tools: $(echo $listed)"
}

echo "== stdio: vigil mcp"
timeout 60 "$inspector" --cli "$work/vigil" mcp --db "$work/mcp.db" --method tools/list \
  >"$work/stdio.json" 2>"$work/stdio.err" || fail "stdio: inspector failed: $(cat "$work/stdio.err")"
check_tools stdio "$work/stdio.json"

echo "== streamable HTTP: vigil serve, /mcp"
"$work/vigil" serve --db "$work/serve.db" --addr 127.0.0.1:0 >"$work/serve.log" 2>&1 &
serve_pid=$!
url=
for _ in $(seq 1 300); do
  url=$(grep -o 'url=http://127\.0\.0\.1:[0-9]*' "$work/serve.log" | head -n 1 | cut -d= -f2 || true)
  [ -n "$url" ] && break
  kill -0 "$serve_pid" 2>/dev/null || fail "vigil serve exited: $(cat "$work/serve.log")"
  sleep 0.1
done
[ -n "$url" ] || fail "vigil serve logged no URL within 30s: $(cat "$work/serve.log")"
timeout 60 "$inspector" --cli "$url/mcp" --transport http --method tools/list \
  >"$work/http.json" 2>"$work/http.err" || fail "http: inspector failed: $(cat "$work/http.err")"
check_tools http "$work/http.json"
