#!/bin/sh
# TTFT against prompt reuse (paper 000 Figure 23 shape) on the mini preset: makes the model
# and a loopback cache server, then runs bench/cache/kv_pool_ttft_main.cc.
#   bench/cache/kv_pool_ttft_bench.sh [BUILD_DIR] [extra bench flags...]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT
"$build/apps/peerserve" make-test-model --preset mini --out "$work/mini" --seed 1 >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/apps/peerserve" cache-server --listen "127.0.0.1:$port" --dram 4GiB >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$work/server.log" && break; sleep 0.1; done
"$build/bench/cache/peerserve_bench_kv_pool_ttft" --model "$work/mini" --pool "127.0.0.1:$port" "$@"
