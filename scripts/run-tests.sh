#!/bin/sh
# Runs each cmocka suite given, in its own scratch directory, and ends with one summary line
# "N passed, N failed" summed over all suites (a suite that dies counts as one failure).
set -u
build=$1; shift
passed=0; failed=0; skipped=0; bad=""
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-test.XXXXXX")
for t in "$@"; do
    case "$t" in /*) ;; *) t="$PWD/$t" ;; esac
    name=$(basename "$t")
    dir="$scratch/$name"; mkdir -p "$dir"
    out="$dir.log"
    start=$(date +%s)
    (cd "$dir" && KVT_SCRATCH="$dir" "$t") >"$out" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | awk '{s+=$1} END {print s+0}')
    if [ "$rc" = 77 ]; then
        skipped=$((skipped + 1)); echo "SKIP $name (${secs}s)"; continue
    fi
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$f" != 0 ]; then
        bad="$bad $name"
        echo "FAIL $name: $p passed, $f failed (${secs}s)"
        sed 's/^/    /' "$out" | tail -n 60
    else
        echo "ok   $name: $p passed (${secs}s)"
    fi
done
[ -z "$bad" ] && rm -rf "$scratch"
[ -n "$bad" ] && echo "failing suites:$bad (logs in $scratch)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
