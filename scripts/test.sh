#!/usr/bin/env bash
# Every check CI runs. Needs only Go and the module proxy: xcaddy is
# installed by `make test` before this script runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH)/bin:$PATH"

# How much slower than an idle machine this one may be: a factor that
# stretches what the tests wait for an event before they call it a hang
# (xcaddy-test/harness, FQ_TEST_SLOWDOWN), never a bound they assert. CI
# machines are shared: 2 by default; three times that under the race
# detector. Raise it on a loaded machine: FQ_TEST_SLOWDOWN=4 make test.
slowdown=${FQ_TEST_SLOWDOWN:-2}
race_slowdown=$(awk -v s="$slowdown" 'BEGIN { print s * 3 }')
export FQ_TEST_SLOWDOWN=$slowdown

# Debian's packages and the npm client the later stages need, fetched and
# installed in the background while the first checks compile: the
# downloads wait on the network, the checks on the CPU.
sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
tools_log=$(mktemp)
(
	set -e
	apt_install() { # [apt-get install options...] package...
		echo "installing ${*: -1} from Debian's packages"
		$sudo apt-get install -y -qq "$@" || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@"; }
	}
	# redis-cli (redis-tools) also builds the end-to-end tests' three-node
	# Redis Cluster (redis-cli --cluster create); redis-server --sentinel
	# runs their sentinel.
	command -v redis-server >/dev/null || apt_install redis-server
	command -v redis-cli >/dev/null || apt_install redis-tools
	command -v promtool >/dev/null || apt_install --no-install-recommends prometheus
	command -v chromium >/dev/null || apt_install chromium
	if ! command -v npm >/dev/null; then
		echo "installing Node.js and npm from Debian's packages"
		$sudo apt-get update -qq && $sudo apt-get install -y -qq nodejs npm
	fi
	# The official OpenAI and Anthropic Node clients the end-to-end tests
	# drive (pinned by their package-lock.json).
	(cd xcaddy-test/openai-client && npm ci --no-audit --no-fund --loglevel=error)
	(cd xcaddy-test/anthropic-client && npm ci --no-audit --no-fund --loglevel=error)
) >"$tools_log" 2>&1 &
tools_pid=$!

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt would change: $bad"; exit 1; fi

# Three modules: the plugin (what xcaddy builds into Caddy, with only what
# it runs in its go.mod), its end-to-end tests (xcaddy-test: chromedp,
# vegeta) and the simulator's command (cmd/fqsim: gonum/plot).
echo "== go mod tidy -diff (a go.mod or go.sum a fresh clone could not build from)"
go mod tidy -diff
go -C xcaddy-test mod tidy -diff
go -C cmd/fqsim mod tidy -diff

echo "== docs: every test, file, make target and link README.md and docs/ name exists"
./scripts/check-docs.sh

echo "== go vet"
go vet ./...
go -C xcaddy-test vet ./...
go -C cmd/fqsim vet ./...

echo "== tools: redis-server, promtool, chromium (Debian's packages) and the OpenAI and Anthropic Node clients (npm)"
if ! wait "$tools_pid"; then
	cat "$tools_log"
	echo "installing the tools failed"
	exit 1
fi
rm -f "$tools_log"

echo "== redis-server for the Redis stores' and sync.lua's tests against a real server"
redis_port=$((20000 + RANDOM % 20000))
redis_dir=$(mktemp -d)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$redis_dir" \
	--daemonize yes --pidfile "$redis_dir/redis.pid" >/dev/null
trap 'kill "$(cat "$redis_dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$redis_dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
export REDIS_ADDR=127.0.0.1:$redis_port

echo "== unit, engine and simulator tests (race)"
FQ_TEST_SLOWDOWN=$race_slowdown go test -race -count=1 ./fairqueue/... ./budget/ ./degrade/ ./llmapi/ ./quota/ ./cluster/ ./costmodel/ ./history/ ./internal/...
FQ_TEST_SLOWDOWN=$race_slowdown go -C cmd/fqsim test -race -count=1 ./...

echo "== without the race detector: the accuracy tests and full-size runs it makes too slow"
go test -count=1 ./llmapi/ ./fairqueue/simulator/

echo "== every benchmark once, so that none rots (make bench measures them)"
go test -count=1 -run '^$' -bench . -benchtime 1x ./fairqueue/... ./budget/ ./degrade/ ./llmapi/ ./quota/ ./cluster/ ./costmodel/ ./history/ .

# A count of inputs, not a duration: with -fuzztime 20s the coordinator's
# deadline can fire while a worker is mid-input on a stalled shared machine,
# and Go reports "context deadline exceeded" as a failure of the target.
echo "== fuzz targets, a bounded count of inputs each, from the committed corpus (llmapi/testdata/fuzz)"
for target in FuzzParse FuzzLightMode FuzzStreamScanner FuzzParseUsage FuzzInlineTexts FuzzApproxCount FuzzBPEMatchesTiktoken; do
	go test -run '^$' -fuzz "^${target}\$" -fuzztime 300000x ./llmapi/
done
echo "== tenant ID fuzz targets (fairqueue/testdata/fuzz, testdata/fuzz): a valid ID is kept under its own quota keys only; any X-Tenant-ID value is refused with 400 or served as exactly that tenant"
go test -run '^$' -fuzz '^FuzzTenantKeys$' -fuzztime 100000x ./fairqueue/
# Each input the handler accepts is a real HTTP round trip to a test upstream: fewer inputs.
go test -run '^$' -fuzz '^FuzzTenantHeader$' -fuzztime 10000x .

echo "== handler tests (race); the Grafana/alerts test also runs promtool (Debian's prometheus) on the rules"
FQ_TEST_SLOWDOWN=$race_slowdown go test -race -count=1 .

# The tests of the e2e package that share nothing run three at a time
# (t.Parallel): most of their time is waiting on generations and floods.
echo "== end-to-end tests against the xcaddy-built binary"
go -C xcaddy-test test -count=1 -timeout 25m -parallel 3 ./...
