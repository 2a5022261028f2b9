#!/usr/bin/env bash
# Starts two fake OpenAI-compatible upstreams on 127.0.0.1:8001 and :8002 and
# runs the xcaddy-built Caddy on examples/Caddyfile (gateway on :8080, admin
# on localhost:2019). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
./bin/fakellm -listen 127.0.0.1:8001 -name fake-1 -slots 16 & pids+=($!)
./bin/fakellm -listen 127.0.0.1:8002 -name fake-2 -slots 16 & pids+=($!)
cat <<MSG
Gateway on http://localhost:8080 — try:
  curl -s localhost:8080/v1/chat/completions -H 'X-Tenant-ID: marketing' \\
    -d '{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
Metrics: curl -s localhost:2019/metrics | grep fair_queue
MSG
./bin/caddy run --config examples/Caddyfile --adapter caddyfile
