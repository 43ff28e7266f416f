#!/usr/bin/env bash
# Model caching (docs/caching_pool.md), the paper's Table 2 scenario scaled down to the mini
# preset: load time of an engine that reads the checkpoint from disk (page cache dropped
# first when this user may) against engines that fetch it from a cache server over loopback,
# and the resident memory of the cache server and of 1 and 4 engines.
#   bench/cache/model_cache_bench.sh [BUILD_DIR] [WORK_DIR]
set -euo pipefail
build=${1:-build}
work=${2:-$(mktemp -d)}
bin="$build/apps/peerserve"
mkdir -p "$work"
pids=()
cleanup() {
  for p in "${pids[@]}" $(cat "$work"/*.pid 2>/dev/null); do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$work"/*.pid
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
[[ -f "$work/mini/config.json" ]] || "$bin" make-test-model --preset mini --out "$work/mini" --seed 1 >/dev/null 2>&1
rss_mb() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
# Starts an engine; prints seconds from start to "serving model".
start_engine() {  # name, --model dir, extra...
  local name=$1 dir=$2; shift 2
  local port; port=$(free_port)
  local t0; t0=$(date +%s.%N)
  "$bin" serve --model "$dir" --model-cache-id mini --model-cache "127.0.0.1:$pool_port" \
    --port "$port" --threads 2 --kv-cache-memory 256MiB "$@" >"$work/$name.log" 2>&1 &
  echo $! >"$work/$name.pid"
  for _ in $(seq 1 600); do grep -q "serving model" "$work/$name.log" && break; sleep 0.05; done
  grep -q "serving model" "$work/$name.log" || { cat "$work/$name.log" >&2; exit 1; }
  echo "$(date +%s.%N) - $t0" | bc
}
pool_port=$(free_port)
"$bin" cache-server --listen "127.0.0.1:$pool_port" --dram 4GiB >"$work/pool.log" 2>&1 &
pool_pid=$!; pids+=($pool_pid)
for _ in $(seq 100); do grep -q "listening on" "$work/pool.log" && break; sleep 0.1; done

dropped="page cache dropped"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || dropped="page cache NOT dropped (not permitted)"
cold=$(start_engine disk "$work/mini")
for _ in $(seq 1 600); do grep -q "model cache: published\|already in the pool" "$work/disk.log" && break; sleep 0.1; done
published=$(grep "model cache:" "$work/disk.log" | tail -1)
echo "engine 1 from disk ($dropped): ready in ${cold} s, RSS $(rss_mb "$(cat "$work/disk.pid")") MB"
echo "  $published"
echo "cache server after publishing: RSS $(rss_mb $pool_pid) MB"
for i in 2 3 4 5; do  # engines 2..5: 4 engines from the pool
  rm -rf "$work/fetched$i"
  t=$(start_engine "pool$i" "$work/fetched$i")
  echo "engine $i from the pool: ready in ${t} s, RSS $(rss_mb "$(cat "$work/pool$i.pid")") MB; $(grep '^model cache: fetched' "$work/pool$i.log" | sed 's/^model cache: //')"
done
total=0
for f in "$work"/disk.pid "$work"/pool?.pid; do total=$(( total + $(rss_mb "$(cat "$f")") )); done
echo "resident: cache server $(rss_mb $pool_pid) MB + 5 engines ${total} MB"
