# caddy-fair-queue — the two commands a newcomer needs:
#   make run    build Caddy with this plugin (xcaddy) and serve examples/Caddyfile
#               in front of two bundled fake LLM upstreams
#   make test   everything CI runs: vet, gofmt, unit + race tests, simulator
#               scenarios, and end-to-end tests of the xcaddy-built binary

CADDY_VERSION  ?= v2.11.9
XCADDY_VERSION ?= v0.4.5
MODULE         := github.com/caddy-fair-queue/caddy-fair-queue
GOBIN          := $(shell go env GOPATH)/bin
XCADDY         := $(GOBIN)/xcaddy

.PHONY: run test xcaddy build fake bench bench-instructions bench-cluster sim load

xcaddy:
	@test -x $(XCADDY) || go install github.com/caddyserver/xcaddy/cmd/xcaddy@$(XCADDY_VERSION)

# The @v0.0.0 pin lets xcaddy replace the module with this checkout even
# where the module proxy refuses unpublished modules.
build: xcaddy
	$(XCADDY) build $(CADDY_VERSION) --with $(MODULE)@v0.0.0=. --output bin/caddy

fake:
	go -C xcaddy-test build -o ../bin/fakellm ./fakellm

run: build fake
	./scripts/run-example.sh

test: xcaddy
	./scripts/test.sh

bench:
	go test -run '^$$' -bench . -benchmem ./fairqueue/... ./budget/ ./degrade/ ./llmapi/ ./quota/ ./cluster/ ./costmodel/ ./history/ .

# Instructions per request through reverse_proxy alone and through
# fair_queue (BenchmarkProxyInMemory under cachegrind): the same count on
# every run, however busy the machine. Installs valgrind (Debian) if missing.
bench-instructions:
	./scripts/instructions.sh

sim:
	go -C cmd/fqsim run . -scenario seed000

# Through the binary: one xcaddy-built Caddy (cached by source hash), a plain
# reverse_proxy site and a fair_queue site in front of the same fast
# upstream, alternating rounds of small requests (vegeta); prints throughput,
# p50/p99 and Caddy CPU per request, and the fair/plain ratios. Flags, e.g.:
# make load LOADFLAGS='-rounds 10 -duration 3s -workers 16'
# Backlogged mode: 32 KB prompts, an upstream that takes 20 ms, and a third
# site whose queue always holds most requests; it reports the backlogged
# request's Caddy CPU over the same path idle: make load LOADFLAGS=-backlog
LOADFLAGS ?=
load: xcaddy
	go -C xcaddy-test run ./fqload $(LOADFLAGS)

# A sparse realtime tenant's waits under a flood, one gateway beside three
# sharing the pool through Redis (TestClusterSparseRealtime's 1.5x P95 bound; about a minute and a half;
# needs redis-server, which `make test` installs).
bench-cluster: xcaddy
	go -C xcaddy-test test -run '^$$' -bench ClusterSparseRealtime -benchtime 1x ./e2e/
