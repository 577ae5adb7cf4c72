#!/bin/sh
# On the GPU machine, from the repository root with .gpu/ (scripts/gpu-pack.sh) beside it:
#   scripts/gpu-run.sh checks   the Python extension built against .gpu/libkvtier.a, the
#                               device suites, the Python device/hf/pcache tests, bench_device
#                               (4 GiB save included) and bench_tier_device, 256 MiB - 4 GiB
#   scripts/gpu-run.sh e2e      python/bench/bench_hf_ttft.py (32 layers, hidden 4096, 16,384
#                               tokens)
#   scripts/gpu-run.sh benches  bench_tier_device, then the e2e bench
#   scripts/gpu-run.sh tier     the e2e bench, bench_tier_device, then the device suites and
#                               Python tests (no bench_device)
#   scripts/gpu-run.sh share    the device suites and Python tests, then shared prefixes:
#                               bench_ram_share --cuda and bench_share (on that machine's disk)
# Output goes to $OUT (default ./gpu-out).
set -u
root=$(pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out" /root/kvt
export LD_LIBRARY_PATH=$root/.gpu/lib LIBRARY_PATH=$root/.gpu/lib PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/card.txt"
(cd python && KVTIER_BUILD=$root/.gpu python3 setup.py -q build --build-base /root/kvt/pyb \
    --build-lib /root/kvt/py) >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
export PYTHONPATH=/root/kvt/py
suites() {
    for t in test_device test_tier_device test_store_share_into test_tier_share; do
        (cd /root/kvt && "$root/.gpu/bin/$t") >"$out/$t.log" 2>&1
        echo "$t: exit $?"; grep -E "PASSED|FAILED|SKIPPED|skipped" "$out/$t.log"
    done
    (cd /root/kvt && python3 -m pytest -q -p no:cacheprovider --basetemp=/root/kvt/pt \
        "$root/python/tests/test_device.py" "$root/python/tests/test_hf.py" \
        "$root/python/tests/test_pcache.py" "$root/python/tests/test_pcache_share.py" -rs) >"$out/pytest.log" 2>&1
    echo "pytest: exit $?"; tail -8 "$out/pytest.log"
}
case ${1:-checks} in
checks)
    suites
    mkdir -p /root/bd
    .gpu/bin/bench_device --dir /root/bd --size 256M,4G --repeat 2 2>&1 | tee "$out/bench_device.txt"
    .gpu/bin/bench_tier_device --dir /root/btd --size 256M,1G,4G --repeat 3 2>&1 |
        tee "$out/bench_tier_device.txt"
    ;;
e2e)
    python3 python/bench/bench_hf_ttft.py --dir /root/hf 2>&1 | tee "$out/bench_hf_ttft.txt"
    ;;
tier)
    python3 python/bench/bench_hf_ttft.py --dir /root/hf 2>&1 | tee "$out/bench_hf_ttft.txt"
    .gpu/bin/bench_tier_device --dir /root/btd --size 256M,1G,4G --repeat 3 2>&1 |
        tee "$out/bench_tier_device.txt"
    suites
    ;;
share)
    suites
    .gpu/bin/bench_ram_share --cuda 2>&1 | tee "$out/bench_ram_share.txt"
    mkdir -p /root/bs
    .gpu/bin/bench_share /root/bs 2>&1 | tee "$out/bench_share.txt"
    ;;
benches)
    .gpu/bin/bench_tier_device --dir /root/btd --size 256M,1G,4G --repeat 5 2>&1 |
        tee "$out/bench_tier_device.txt"
    python3 python/bench/bench_hf_ttft.py --dir /root/hf 2>&1 | tee "$out/bench_hf_ttft.txt"
    ;;
esac
