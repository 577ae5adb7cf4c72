#!/bin/sh
# Fetches llama.cpp for the llama.cpp integration, once, into $1 (build/llama): the prebuilt
# x86-64 CPU libraries of @node-llama-cpp/linux-x64 and the headers of the matching llama.cpp
# source (the git bundle inside node-llama-cpp), both from npm at pinned versions, without
# running any package script. Later builds find them there and need no network.
#   $1/lib/      libllama, libggml, libggml-base, one libggml-cpu-* per CPU generation
#   $1/include/  llama.h and ggml's public headers
set -eu
dest=$1
version=3.22.1
stamp="$dest/.fetched-$version"
[ -f "$stamp" ] && exit 0
if ! command -v npm >/dev/null 2>&1 || ! command -v git >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "llama-fetch: installing npm and git" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm git >&2
    else
        echo "llama-fetch: needs npm and git; run as root: apt-get install -y npm git" >&2
        exit 1
    fi
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-llama.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "llama-fetch: npm pack @node-llama-cpp/linux-x64@$version node-llama-cpp@$version" >&2
(cd "$tmp" && npm pack --silent --ignore-scripts "@node-llama-cpp/linux-x64@$version" \
    "node-llama-cpp@$version" >/dev/null)
mkdir -p "$tmp/bins" "$tmp/src"
tar -xzf "$tmp/node-llama-cpp-linux-x64-$version.tgz" -C "$tmp/bins"
tar -xzf "$tmp/node-llama-cpp-$version.tgz" -C "$tmp/src" package/llama/gitRelease.bundle
git clone -q --bare "$tmp/src/package/llama/gitRelease.bundle" "$tmp/llama.git"
rm -rf "$dest/lib" "$dest/include"
mkdir -p "$dest/lib" "$dest/include"
cp "$tmp"/bins/package/bins/linux-x64/lib*.so "$dest/lib/"
rm -f "$dest/lib/libllama-common.so" # node-llama-cpp's own helpers, not llama.cpp's API
git --git-dir="$tmp/llama.git" archive HEAD include/llama.h ggml/include |
    tar -x -C "$tmp" 
cp "$tmp/include/llama.h" "$tmp"/ggml/include/*.h "$dest/include/"
git --git-dir="$tmp/llama.git" archive HEAD LICENSE | tar -x -C "$dest"
touch "$stamp"
