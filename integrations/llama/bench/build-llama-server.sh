#!/bin/sh
# Builds llama.cpp's own llama-server (CPU, Release) from the source of the llama.cpp release
# the integration uses, for serve_bench.py only: $1 a tar.gz of that source (`git archive`
# of the bundle inside node-llama-cpp@3.22.1, as scripts/llama-fetch.sh takes it), $2 the
# build directory; prints the binary's path.
set -eu
src=$2/src
mkdir -p "$src"
tar -xzf "$1" -C "$src"
cmake -S "$src" -B "$2/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON >&2
cmake --build "$2/build" -j"${JOBS:-2}" --target llama-server >&2
echo "$2/build/bin/llama-server"
