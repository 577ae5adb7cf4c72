#!/bin/sh
# Checks that every repository path README.md and docs/**/*.md name exists:
#  - a word starting with a top-level folder or file of the repository (`src/io/stream.h`,
#    docs/REMOTE.md, `tests/golden/`); a built program may be named by its source's path
#    without ".c" (`bench/bench_tier_decode`); paths under build/ are outputs and not checked;
#  - a bare file name in backticks with a source extension (`read_way.c`) must be the name
#    of some file of the repository;
#  - a Markdown link target, relative to the document;
#  - nothing may point outside the repository (`../` leaving it, the checkout's shared/).
# Words holding a placeholder (<dir>, NAME, *, $X, ...) are skipped. Prints each failure,
# cmocka-style totals for scripts/run-tests.sh and "N passed, N failed".
# Usage: check_doc_paths.sh [REPO_ROOT]   (default: the repository holding this script)
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_doc_paths.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Names of files that are not ours but that the docs name on purpose.
external="llama.h"

find . -path ./build -prune -o -path ./.git -prune -o -type f -print |
    sed 's|.*/||' | sort -u > "$tmp/basenames"
top=$(ls -A | grep -vx -e build -e .git)

docs=$( (echo README.md; find docs -name '*.md') | sort)
for doc in $docs; do
    dir=$(dirname "$doc")
    # Markdown links: "](target)".
    grep -oE '\]\([^) ]+\)' "$doc" | sed -E 's/^\]\(//; s/\)$//; s/#.*//' |
        grep -vE '^(https?:|mailto:|$)' | while read -r t; do echo "link $doc $dir/$t"; done
    # Words made of path characters, anywhere in the text.
    tr -s ' \t|()[]{}"'"'"',;=' '\n' < "$doc" | tr -d '`' | sed -E 's/::.*//; s/[.:]+$//' |
        grep / | sort -u | while read -r w; do echo "word $doc $w"; done
    # Bare file names in backticks.
    grep -oE '`[A-Za-z0-9_.+-]+\.(c|h|md|sh|py)`' "$doc" | tr -d '`' | sort -u |
        while read -r w; do echo "bare $doc $w"; done
done > "$tmp/candidates"

check() { # kind doc word -> PASS, FAIL ... or nothing (not a repository path)
    kind=$1 doc=$2 w=$3
    case "$w" in
    *'<'* | *'>'* | *'*'* | *'$'* | *'…'* | *'...'* | *'?'* | *'%'* | *'~'*) return ;;
    esac
    # a component in capitals without an extension is a placeholder (fuzz/corpus/NAME)
    if echo "$w" | tr '/' '\n' | grep -qxE '[A-Z_]+'; then return; fi
    case "$kind" in
    link)
        real=$(realpath -m "$w")
        case "$real" in
        "$root" | "$root"/*) ;;
        *) echo "FAIL: $doc links to $w, outside the repository"; return ;;
        esac
        if [ -e "$real" ]; then echo PASS; else echo "FAIL: $doc links to $w, which does not exist"; fi
        return ;;
    bare)
        case " $external " in *" $w "*) return ;; esac
        if grep -qxF "$w" "$tmp/basenames"; then echo PASS; else
            echo "FAIL: $doc names \`$w\`, no file of the repository has that name"
        fi
        return ;;
    esac
    case "$w" in
    ../* | */../* | shared/* | */shared/*)
        echo "FAIL: $doc names $w: a path outside the repository"; return ;;
    esac
    w=${w#./}
    first=${w%%/*}
    echo "$top" | grep -qxF "$first" || return
    p=${w%/}
    if [ -e "$p" ] || [ -e "$p.c" ]; then echo PASS; else
        echo "FAIL: $doc names $w, which does not exist"
    fi
}

sort -u "$tmp/candidates" | while read -r kind doc w; do check "$kind" "$doc" "$w"; done \
    > "$tmp/results"
grep '^FAIL' "$tmp/results"
passed=$(grep -c '^PASS$' "$tmp/results")
failed=$(grep -c '^FAIL' "$tmp/results")
echo "[  PASSED  ] $passed test(s)."
[ "$failed" = 0 ] || echo "[  FAILED  ] $failed test(s), listed below:"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
