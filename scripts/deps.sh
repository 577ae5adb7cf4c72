#!/bin/sh
# Installs the Debian packages the build and tests need (when run as root), or prints the
# exact apt-get line to run. Writes nothing else; the Makefile runs it once per build dir.
set -u
need="build-essential pkg-config libjansson-dev libcmocka-dev liburing-dev clang libclang-rt-14-dev"
# the style check in make test (tests/docs/check_format.sh)
need="$need clang-format"
# the remote tier (src/remote/): hiredis, and Redis for its tests and benchmark
need="$need libhiredis-dev redis-server redis-tools"
# kvtier-llama serve: its HTTP server
need="$need libmicrohttpd-dev"
# the Python package (python/): its build, its tests and a venv install without network
need="$need python3-dev python3-setuptools python3-numpy python3-torch python3-pytest python3-venv python3-pip"
[ "${KVT_DEPS_EXTRA:-}" ] && need="$need $KVT_DEPS_EXTRA"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "deps: installing:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || true
    apt-get install -y -qq --no-install-recommends $missing >&2 && exit 0
    echo "deps: apt-get install failed" >&2
    exit 1
fi
echo "deps: missing Debian packages; run as root:" >&2
echo "  apt-get install -y$missing" >&2
exit 1
