#!/bin/sh
# Runs the Node.js suites given (node --test) against the build in $1, each in a scratch
# directory, and ends with the summary line of run-tests.sh: "N passed, N failed".
set -u
build=$(cd "$1" && pwd); shift
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-node.XXXXXX")
passed=0; failed=0; bad=""
for t in "$@"; do
    name=$(basename "$t" .mjs)
    out="$scratch/$name.log"
    start=$(date +%s)
    KVT_BUILD_DIR="$build" KVT_SCRATCH="$scratch" node --test --test-reporter=tap "$t" >"$out" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    p=$(sed -n 's/^# pass \([0-9]*\)/\1/p' "$out"); f=$(sed -n 's/^# fail \([0-9]*\)/\1/p' "$out")
    p=${p:-0}; f=${f:-0}
    [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" != 0 ]; then
        bad="$bad $name"; echo "FAIL $name: $p passed, $f failed (${secs}s)"
        sed 's/^/    /' "$out" | tail -n 80
    else
        echo "ok   $name: $p passed (${secs}s)"
    fi
done
[ -z "$bad" ] && rm -rf "$scratch"
[ -n "$bad" ] && echo "failing suites:$bad (logs in $scratch)"
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" = 0 ]
