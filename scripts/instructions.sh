#!/usr/bin/env bash
# Instructions per request through each handler of BenchmarkProxyInMemory:
# Caddy's reverse_proxy alone and fair_queue in front of it, with the
# upstream in memory, so that the whole request runs on one goroutine and
# its count is the same on every run, however busy the machine
# (cachegrind; the garbage collector is off, so -benchmem's B/op and
# allocs/op count what it would do). Each case runs twice, LOW and HIGH
# requests, in separate processes; the difference over HIGH-LOW cancels
# the start-up. cpu.rdtscp=off: valgrind stops a Go 1.26 program at the
# RDTSCP its runtime reads on a contended lock. Usage: scripts/instructions.sh [case ...]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
	sudo=""
	[ "$(id -u)" -ne 0 ] && sudo=sudo
	echo "== installing valgrind (Debian's package)"
	$sudo apt-get install -y -qq valgrind >/dev/null 2>&1 ||
		{ $sudo apt-get update -qq && $sudo apt-get install -y -qq valgrind >/dev/null; }
fi

cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(plain fair_queue fair_queue_approx fair_queue_quota)
low=${LOW:-1000}
high=${HIGH:-3000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/bench.test" .

count() { # case requests -> instructions of the whole process
	GOGC=off GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=cachegrind --cache-sim=no \
		--cachegrind-out-file="$work/$1.$2.out" "$work/bench.test" -test.run '^$' \
		-test.bench "^BenchmarkProxyInMemory\$/^$1\$" -test.benchtime "${2}x" >"$work/$1.$2.log" 2>&1
	grep -q "BenchmarkProxyInMemory/$1" "$work/$1.$2.log" || { cat "$work/$1.$2.log" >&2; exit 1; }
	awk '/^summary:/ {print $2}' "$work/$1.$2.out"
}

plain=""
printf '%-20s %14s %10s\n' case instr/request vs_plain
for c in "${cases[@]}"; do
	a=$(count "$c" "$low")
	b=$(count "$c" "$high")
	per=$(((b - a) / (high - low)))
	vs=""
	if [ "$c" = plain ]; then
		plain=$per
	elif [ -n "$plain" ]; then
		vs=$(awk -v f="$per" -v p="$plain" 'BEGIN { printf "%+.1f%%", 100 * (f / p - 1) }')
	fi
	printf '%-20s %14s %10s\n' "$c" "$per" "$vs"
done
