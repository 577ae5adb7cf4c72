#!/bin/sh
# Checks that every C source and header of the repository is as clang-format writes it (the
# .clang-format beside it: the repository's, python/src's for the extension), one file a
# test. Prints each file that differs, cmocka-style totals for scripts/run-tests.sh and
# "N passed, N failed".
# Usage: check_format.sh [REPO_ROOT]   (default: the repository holding this script)
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 1
cf=$(command -v clang-format || command -v clang-format-14) || {
    echo "check_format: clang-format is not installed (scripts/deps.sh installs it)"
    echo "0 passed, 1 failed"
    exit 1
}
passed=0 failed=0
for f in $(git ls-files '*.c' '*.h' 2>/dev/null || find . -path ./build -prune -o -name '*.[ch]' -print); do
    if "$cf" --dry-run -Werror "$f" >/dev/null 2>&1; then
        passed=$((passed + 1))
    else
        echo "FAIL: $f is not clang-format clean (clang-format -i $f)"
        failed=$((failed + 1))
    fi
done
echo "[  PASSED  ] $passed test(s)."
[ "$failed" = 0 ] || echo "[  FAILED  ] $failed test(s), listed below:"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
