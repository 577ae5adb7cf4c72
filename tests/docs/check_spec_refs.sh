#!/bin/sh
# Checks that the specs in docs/spec/ define what the code and the docs cite:
#  - every check ID (V1, L3, ...) defined once, as a table row "| ID | ... |" of docs/spec/;
#  - every check ID that a message of the library, the CLI or the integrations can carry
#    (a string literal containing "ID:") defined there;
#  - every section a file cites ("FORMAT.md §11.2", "STORE §12.4", or a bare "§5" inside a
#    spec) a heading of that spec.
# Prints each failure, cmocka-style totals for scripts/run-tests.sh and "N passed, N failed".
# Usage: check_spec_refs.sh [REPO_ROOT]   (default: the repository holding this script)
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
spec=$root/docs/spec
results=$(mktemp "${TMPDIR:-/tmp}/check_spec_refs.XXXXXX")
trap 'rm -f "$results"' EXIT
passed=0
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
pass() { passed=$((passed + 1)); }

if [ ! -d "$spec" ]; then
    echo "FAIL: $spec does not exist"
    echo "[  FAILED  ] 1 test(s), listed below:"
    echo "0 passed, 1 failed"
    exit 1
fi

# The IDs defined: the first cell of a table row that is a letter and one or two digits.
defs=$(grep -hoE '^\| *[A-Z][0-9]{1,2} *\|' "$spec"/*.md | tr -d '| ')
for id in $(printf '%s\n' $defs | sort -u); do
    n=$(printf '%s\n' $defs | grep -cx "$id")
    if [ "$n" = 1 ]; then pass; else fail "check ID $id is defined $n times in docs/spec/"; fi
done

# The IDs the code can emit: "ID:" inside a C string literal.
emitted=$(cd "$root" && grep -rhoE '"([^"\\]|\\.)*"' --include='*.c' --include='*.h' \
              src tools integrations python/src 2>/dev/null |
          grep -oE '(^|[^A-Za-z0-9_])[A-Z][0-9]{1,2}:' | grep -oE '[A-Z][0-9]{1,2}' | sort -u)
if [ -z "$emitted" ]; then fail "no check ID found in the messages of src/ (pattern broken?)"; fi
for id in $emitted; do
    if printf '%s\n' $defs | grep -qx "$id"; then
        pass
    else
        where=$(cd "$root" && grep -rlE "\"[^\"]*(^|[^A-Za-z0-9_])$id:" --include='*.c' \
                    --include='*.h' src tools integrations python/src 2>/dev/null | head -n 3)
        fail "check ID $id is emitted ($(echo $where)) but not defined in docs/spec/"
    fi
done

# Section citations. Outside the specs only "NAME.md §N" / "NAME §N" count; inside a spec a
# bare "§N" cites the spec itself.
refs=$(cd "$root" && grep -rIoE '(FORMAT|CACHES|STORE|TIER)(\.md)? §[0-9]+(\.[0-9]+)*' \
           --exclude-dir=build --exclude-dir=.git . 2>/dev/null |
       sed -E 's/^\.\///; s/\.md / /; s/ §/ /; s/:/ /')
own=$(for f in "$spec"/*.md; do
          name=$(basename "$f" .md)
          grep -oE '((FORMAT|CACHES|STORE|TIER)(\.md)? )?§[0-9]+(\.[0-9]+)*' "$f" |
              grep -vE '^(FORMAT|CACHES|STORE|TIER)' | sed "s|^§|docs/spec/$name.md $name |"
      done)
printf '%s\n%s\n' "$refs" "$own" | awk 'NF == 3 {print $2, $3, $1}' | sort -u -k1,2 |
    while read -r doc sec file; do
        target=$spec/$doc.md
        if [ ! -f "$target" ]; then
            echo "FAIL: $file cites $doc.md §$sec, but docs/spec/$doc.md does not exist"
            continue
        fi
        case "$sec" in
        *.*) pat="^#{2,} $(echo "$sec" | sed 's/\./\\./g') " ;;
        *) pat="^#{2,} $sec\\. " ;;
        esac
        if grep -qE "$pat" "$target"; then echo PASS; else
            echo "FAIL: $file cites $doc.md §$sec, which docs/spec/$doc.md has no heading for"
        fi
    done > "$results"
grep '^FAIL' "$results"
passed=$((passed + $(grep -c '^PASS$' "$results")))
failed=$((failed + $(grep -c '^FAIL' "$results")))

echo "[  PASSED  ] $passed test(s)."
[ "$failed" = 0 ] || echo "[  FAILED  ] $failed test(s), listed below:"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
