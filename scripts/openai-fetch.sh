#!/bin/sh
# Installs the official OpenAI JavaScript SDK, pinned, into $1 (build/node) for the tests of
# `kvtier-llama serve`, without running any package script; nodejs (v20) comes from apt.
set -eu
dest=$1
version=6.30.1
stamp="$dest/.openai-$version"
[ -f "$stamp" ] && exit 0
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "openai-fetch: installing nodejs and npm" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
    else
        echo "openai-fetch: needs node; run as root: apt-get install -y nodejs npm" >&2
        exit 1
    fi
fi
mkdir -p "$dest"
npm install --silent --ignore-scripts --save-exact --no-audit --no-fund --prefix "$dest" \
    "openai@$version" >&2
touch "$stamp"
