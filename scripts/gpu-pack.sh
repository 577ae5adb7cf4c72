#!/bin/sh
# Packs what a bare GPU machine lacks into .gpu/ (ignored; name it in the device run's carry):
# the library, its build settings, the device suites and benches built here, and the Debian
# shared libraries they link (jansson, hiredis, liburing, cmocka), also under the link names
# the Python extension's build asks for. Then scripts/gpu-run.sh runs there.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
b=$root/build/default
cd "$root"
make -j2 lib tests benches >/dev/null
rm -rf .gpu && mkdir -p .gpu/lib .gpu/bin
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >>.git/info/exclude
cp "$b/libkvtier.a" "$b/config.mk" .gpu/
cp "$b/tests/test_device" "$b/tests/test_tier_device" "$b/tests/test_store_share_into" \
    "$b/tests/test_tier_share" "$b/bench/bench_device" "$b/bench/bench_tier_device" \
    "$b/bench/bench_share" "$b/bench/bench_ram_share" .gpu/bin/
for so in libjansson.so.4 libhiredis.so.0.14 liburing.so.2 libcmocka.so.0; do
    f=$(ldd "$b/tests/test_device" | awk -v n="$so" '$1 == n { print $3 }')
    cp -L "$f" .gpu/lib/
    cp -L "$f" ".gpu/lib/${so%%.so*}.so"
done
du -sh .gpu
