#!/bin/sh
# Runs the Python package's pytest suite against the package built in $2 with the
# interpreter $1 (Debian's /usr/bin/python3), from a scratch directory; pytest's own summary
# line ends the run and its exit status is ours.
set -u
python=$1
pkg=$(cd "$2" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-pytest.XXXXXX")
echo "pytest: python/tests against $pkg"
(cd "$scratch" && PYTHONPATH="$pkg" PYTHONDONTWRITEBYTECODE=1 KVT_SCRATCH="$scratch" \
    "$python" -m pytest -q -p no:cacheprovider --basetemp="$scratch/tmp" "$root/python/tests")
rc=$?
[ "$rc" = 0 ] && rm -rf "$scratch"
exit $rc
