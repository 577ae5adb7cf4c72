#!/usr/bin/env bash
# Runs the libFuzzer targets one after another, SECONDS each, at low priority:
#   fuzz/run.sh SECONDS [NAME...]        (names: fuzz/fuzz_NAME.c; default: all targets)
# A target uses the dictionary fuzz/NAME.dict where there is one, else fuzz/mlxkv.dict.
# Each target grows a working corpus in build/libfuzzer/corpus/NAME (seeded from
# fuzz/corpus/NAME) and writes crashing inputs to build/libfuzzer/artifacts/NAME/ and its log
# to build/libfuzzer/NAME.log. Afterwards `fuzz/run.sh --merge NAME...` minimizes the working
# corpus into fuzz/corpus/NAME (only inputs that add coverage are added).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/libfuzzer
merge=0
if [ "${1:-}" = --merge ]; then merge=1; shift; else secs=${1:?usage: fuzz/run.sh SECONDS [NAME...]}; shift; fi
names=("$@")
if [ ${#names[@]} = 0 ]; then
    for f in fuzz/fuzz_*.c; do n=${f#fuzz/fuzz_}; names+=("${n%.c}"); done
fi
make fuzz
for n in "${names[@]}"; do
    bin=$out/fuzz/fuzz_$n
    dict=fuzz/mlxkv.dict
    [ -f "fuzz/$n.dict" ] && dict=fuzz/$n.dict
    mkdir -p "$out/corpus/$n" "$out/artifacts/$n"
    if [ $merge = 1 ]; then
        "$bin" -merge=1 -dict="$dict" "fuzz/corpus/$n" "$out/corpus/$n" 2>&1 | tail -n 3
        continue
    fi
    len=()
    [ "$n" = header ] && len=(-max_len=65536)
    echo "fuzz $n: ${secs}s, log $out/$n.log"
    rc=0
    nice -n 10 "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -dict="$dict" -print_final_stats=1 "${len[@]}" \
        -artifact_prefix="$out/artifacts/$n/" "$out/corpus/$n" "fuzz/corpus/$n" \
        >"$out/$n.log" 2>&1 || rc=$?
    grep -E '^(#[0-9]+ +DONE|stat::)' "$out/$n.log" | sed "s/^/  $n: /" || true
    [ $rc = 0 ] || echo "fuzz $n: exit $rc, see $out/$n.log and $out/artifacts/$n/"
done
