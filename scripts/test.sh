#!/usr/bin/env bash
# Every check CI runs. Needs only Go and the module proxy: xcaddy is
# installed by `make test` before this script runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH)/bin:$PATH"

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt would change: $bad"; exit 1; fi

echo "== go vet"
go vet ./...

echo "== redis-server (Debian's package) for the Redis quota store's tests against a real server"
if ! command -v redis-server >/dev/null; then
	sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis_port=$((20000 + RANDOM % 20000))
redis_dir=$(mktemp -d)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$redis_dir" \
	--daemonize yes --pidfile "$redis_dir/redis.pid" >/dev/null
trap 'kill "$(cat "$redis_dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$redis_dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_ADDR=127.0.0.1:$redis_port

echo "== unit, engine and simulator tests (race)"
go test -race -count=1 ./fairqueue/... ./budget/ ./degrade/ ./llmapi/ ./quota/ ./slots/ ./shares/ ./costmodel/ ./history/ ./cmd/fqsim/

echo "== without the race detector: the accuracy tests and full-size runs it makes too slow"
go test -count=1 ./llmapi/ ./fairqueue/simulator/

echo "== every benchmark once, so that none rots (make bench measures them)"
go test -count=1 -run '^$' -bench . -benchtime 1x ./fairqueue/... ./budget/ ./degrade/ ./llmapi/ ./quota/ ./slots/ ./shares/ ./costmodel/ ./history/ .

# A count of inputs, not a duration: with -fuzztime 20s the coordinator's
# deadline can fire while a worker is mid-input on a stalled shared machine,
# and Go reports "context deadline exceeded" as a failure of the target.
echo "== fuzz targets, a bounded count of inputs each, from the committed corpus (llmapi/testdata/fuzz)"
for target in FuzzParse FuzzLightMode FuzzStreamScanner FuzzParseUsage FuzzInlineTexts FuzzApproxCount FuzzBPEMatchesTiktoken; do
	go test -run '^$' -fuzz "^${target}\$" -fuzztime 300000x ./llmapi/
done

echo "== handler tests (race); the Grafana/alerts test also runs promtool (Debian's prometheus) on the rules"
if ! command -v promtool >/dev/null; then
	sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 ||
		{ $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
fi
go test -race -count=1 .

echo "== the official OpenAI and Anthropic Node clients the end-to-end tests drive (pinned by their package-lock.json)"
if ! command -v npm >/dev/null; then
	echo "installing Node.js and npm from Debian's packages"
	sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get update -qq && $sudo apt-get install -y -qq nodejs npm
fi
(cd xcaddy-test/openai-client && npm ci --no-audit --no-fund --loglevel=error)
(cd xcaddy-test/anthropic-client && npm ci --no-audit --no-fund --loglevel=error)

echo "== headless Chromium for the dashboard's browser test (Debian's chromium package)"
if ! command -v chromium >/dev/null; then
	sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
	$sudo apt-get install -y -qq chromium >/dev/null 2>&1 ||
		{ $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium >/dev/null; }
fi

echo "== end-to-end tests against the xcaddy-built binary"
go test -count=1 -timeout 25m ./xcaddy-test/...
