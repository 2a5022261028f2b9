#!/bin/sh
# scripts/test.sh runs it first: a stale name fails at once.
# Every test, benchmark, fuzz target, file and make target that README.md or
# docs/*.md names must exist in the tree; every relative link must resolve.
# Run from the repository root. Prints each missing name; exit 1 if any.
cd "${1:-.}" || exit 2
docs="README.md docs/*.md"
missing=0
tmp=$(mktemp -d)
# Every func Test/Benchmark/Fuzz defined in a Go test file.
grep -rhoE '^func (Test|Benchmark|Fuzz)[A-Za-z0-9_]+' --include='*_test.go' . |
	sed 's/^func //' | sort -u >"$tmp/funcs"
# Names the docs use (a pkg. prefix and a /sub-benchmark suffix dropped).
# Test* names are globs where they end in '*' (TestBodyWatch*).
grep -ohE '\b(Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*\*?' $docs | sort -u >"$tmp/names"
while read -r n; do
	case $n in
	*\*) grep -q "^${n%\*}" "$tmp/funcs" || { echo "missing test: $n"; missing=1; } ;;
	*) grep -qx "$n" "$tmp/funcs" || { echo "missing test: $n"; missing=1; } ;;
	esac
done <"$tmp/names"
# File names in backticks or links: anything ending in a known extension.
grep -ohE '[A-Za-z0-9_./-]+\.(go|md|json|yml|yaml|sh|svg|png|Caddyfile|pprof)\b' $docs |
	grep -v '^\.' | grep -v '^DIR/' | sort -u >"$tmp/files"
while read -r f; do
	[ -e "$f" ] && continue
	[ -e "docs/$f" ] && continue
	# a bare name (bpe.go) or a package-relative path (e2e/x.go): found anywhere
	found=$(find . -path ./xcaddy-test/node_modules -prune -o -path "*/$f" -print -o -name "$f" -print 2>/dev/null | head -1)
	[ -n "$found" ] || { echo "missing file: $f"; missing=1; }
done <"$tmp/files"
# Directories named as paths ending in / in backticks (fairqueue/, xcaddy-test/...).
grep -ohE '`[A-Za-z0-9_./-]+/`' $docs | tr -d '`' | sort -u | while read -r d; do
	[ -d "$d" ] || echo "missing dir: $d"
done | tee "$tmp/dirs"
[ -s "$tmp/dirs" ] && missing=1
# make targets.
grep -ohE '(`|^)make [a-z][a-z0-9-]*' $docs | awk '{print $2}' | sort -u | while read -r t; do
	grep -qE "^$t:" Makefile || echo "missing make target: $t"
done | tee "$tmp/targets"
[ -s "$tmp/targets" ] && missing=1
# Relative markdown links (the part before any #anchor).
for d in $docs; do
	dir=$(dirname "$d")
	grep -oE '\]\([^)#]+(#[^)]*)?\)' "$d" | sed -E 's/^\]\(//; s/\)$//; s/#.*//' | grep -vE '^(https?:|mailto:|$)' |
		while read -r l; do
			[ -e "$dir/$l" ] || echo "broken link in $d: $l"
		done
done | tee "$tmp/links"
[ -s "$tmp/links" ] && missing=1
# Anchors of relative links (#section) must name a heading of the target.
python3 - $docs <<'PY' | tee "$tmp/anchors"
import re, sys, os
def slugs(path):
    out, fence = set(), False
    for line in open(path):
        if line.startswith('```'):
            fence = not fence
        if fence or not line.startswith('#'):
            continue
        t = line.lstrip('#').strip().lower()
        t = re.sub(r'[^\w\- ]', '', t)
        out.add(t.replace(' ', '-'))
    return out
for d in sys.argv[1:]:
    for m in re.finditer(r'\]\(([^)\s]*)#([^)]+)\)', open(d).read()):
        target = os.path.join(os.path.dirname(d), m.group(1)) if m.group(1) else d
        if os.path.exists(target) and m.group(2) not in slugs(target):
            print(f"broken anchor in {d}: {m.group(1)}#{m.group(2)}")
PY
[ -s "$tmp/anchors" ] && missing=1
echo "checked $(wc -l <"$tmp/names") test names, $(wc -l <"$tmp/files") file names"
rm -rf "$tmp"
exit $missing
