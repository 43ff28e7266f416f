#!/usr/bin/env bash
# Prefill/decode disaggregation on the `mini` test model (docs/disaggregation.md): 1P1D
# (`serve --role decode` alone on core 1; `serve --role prefill`, the cache-server, the router
# and the bench client on core 0; one kernel thread per instance) against the all-in-one server on both cores, with
# `peerserve bench` at concurrency 8 and 32, 1,024-token prompts, 128 output tokens.
# Prints throughput, TTFT, TPOT, ITL p50/p99 (gaps between stream chunks, as vLLM's bench;
# the server sends one per step, with empty text where the text is held back) and TBT
# p50/p99 (per token: each chunk's gap over the tokens it carries) per setup.
# Usage: bench/serve/disaggregation_bench.sh [BUILD_DIR] [OUT_DIR]   (NUM_PROMPTS, default 32;
# PREFILL_NICE=19 runs the prefill instance at low priority, so that the router and the bench
# client that share its core are not delayed behind prefill computation, as on separate hosts)
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/peerserve_disaggregation_bench}
bin="$build/apps/peerserve"
model="$out/mini"
prompts=${NUM_PROMPTS:-32}
mkdir -p "$out"
[[ -f "$model/config.json" ]] || "$bin" make-test-model --preset mini --out "$model" --seed 1 2>/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_for() {  # log, marker
  for _ in $(seq 1 120); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.5; done
  echo "not ready: $1" >&2; cat "$1" >&2; exit 1
}
common=(--model "$model" --served-model-name mini --max-num-seqs 64 --max-num-batched-tokens 2048
        --kv-cache-memory 1GiB --max-model-len 2048)

bench() {  # name, port, concurrency, [seed offset]: each run its own prompts (no pool hits)
  $pin_client "$bin" bench --url "http://127.0.0.1:$2" --num-prompts "$prompts" \
    --max-concurrency "$3" --input-len 1024 --output-len 128 --seed "$(( $3 + ${4:-0} ))" \
    --no-progress --json "$out/$1-c$3.json" >/dev/null
  python3 - "$out/$1-c$3.json" "$1" "$3" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
itl50, itl99 = r["itl"]["p50_ms"], r["itl"]["p99_ms"]
tbt50, tbt99 = r["tbt"]["p50_ms"], r["tbt"]["p99_ms"]
print(f"{sys.argv[2]:<11} c={sys.argv[3]:<3} done {r['completed']}/{r['completed'] + r['failed']}  "
      f"out tok/s {r['output_throughput']:7.1f}  TTFT p50 {r['ttft']['p50_ms']:8.1f} ms  "
      f"TPOT p50 {r['tpot']['p50_ms']:6.1f} ms  ITL p50 {itl50:6.1f} p99 {itl99:7.1f} ms  "
      f"(p99/p50 {itl99 / itl50:5.2f})  TBT p50 {tbt50:6.1f} p99 {tbt99:7.1f} ms "
      f"(p99/p50 {tbt99 / tbt50:5.2f})")
PY
}

# 1P1D. Core 1 carries the decode instance alone; the prefill instance, the cache server,
# the router and the bench client share core 0.
pin_client="taskset -c 0"
pool_port=$(free_port); prefill_port=$(free_port); decode_port=$(free_port)
taskset -c 0 "$bin" cache-server --listen "127.0.0.1:$pool_port" --dram 4GiB >"$out/pool.log" 2>&1 &
pids+=($!); wait_for "$out/pool.log" "listening on"
PREFILL_NICE=${PREFILL_NICE:-0}
taskset -c 0 nice -n "$PREFILL_NICE" "$bin" serve "${common[@]}" --port "$prefill_port" --threads 1 --role prefill \
  --kv-pool "127.0.0.1:$pool_port" >"$out/prefill.log" 2>&1 &
pids+=($!)
taskset -c 1 "$bin" serve "${common[@]}" --port "$decode_port" --threads 1 --role decode \
  --kv-pool "127.0.0.1:$pool_port" --prefill "127.0.0.1:$prefill_port" >"$out/decode.log" 2>&1 &
pids+=($!)
wait_for "$out/prefill.log" "serving model"; wait_for "$out/decode.log" "serving model"
for c in 8 32; do bench 1P1D "$decode_port" "$c"; done
# The same through the router role (floating, like the cache server and the bench client).
router_port=$(free_port)
taskset -c 0 "$bin" serve --role router --decode "127.0.0.1:$decode_port" --port "$router_port" \
  >"$out/router.log" 2>&1 &
pids+=($!); wait_for "$out/router.log" "role router"
for c in 8 32; do bench 1P1D+router "$router_port" "$c" 1000; done
# The KV hand-off: what the prefill instance pushed straight into the decode instance's
# reserved blocks (bytes, time in the push calls), under the load above and alone (one request
# at a time, 8 prompts: the instances idle while the push runs), against raw TCP loopback
# measured right after (same machine).
scrape() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 ~ "^"m"({|$)" {print $2; exit}'; }
handoff_figures() {
  echo "$(scrape "$prefill_port" peerserve:kv_push_total) $(scrape "$prefill_port" peerserve:kv_push_bytes_total)" \
       "$(scrape "$prefill_port" peerserve:kv_push_seconds_total) $(scrape "$prefill_port" peerserve:kv_push_failures_total)" \
       "$(scrape "$decode_port" peerserve:kv_handoff_bytes_total)"
}
loaded=$(handoff_figures)
prompts=8 bench 1P1D-alone "$decode_port" 1 2000 >/dev/null
alone=$(handoff_figures)
cleanup; pids=()
tcp=$("$build/bench/cache/peerserve_bench_cache_pool" --repeats 3 | awk '/TCP loopback, 1 MiB/ {print $(NF-1)}')
python3 - "$loaded" "$alone" "$tcp" <<'PY'
import sys
loaded = [float(x) for x in sys.argv[1].split()]
alone = [float(x) for x in sys.argv[2].split()]
tcp = float(sys.argv[3])
def report(name, f):
    pushes, nbytes, seconds, failures, received = f
    gbs = nbytes / seconds / 1e9
    print(f"KV hand-off {name}: {pushes:.0f} pushes, {nbytes / pushes / 1e6:.2f} MB and "
          f"{seconds / pushes * 1e3:.2f} ms per request, {gbs:.2f} GB/s = {gbs / tcp:.2f}x raw TCP "
          f"loopback ({tcp:.2f} GB/s); {failures:.0f} blocks refused; decode received "
          f"{received / 1e6:.1f} MB in full blocks")
report("under load (c=8, 32)", loaded)
report("alone (c=1)", [a - b for a, b in zip(alone, loaded)])
PY

# All-in-one on both cores (the bench client floats).
pin_client=""
port=$(free_port)
"$bin" serve "${common[@]}" --port "$port" --threads 2 >"$out/all.log" 2>&1 &
pids+=($!); wait_for "$out/all.log" "serving model"
for c in 8 32; do bench all-in-one "$port" "$c"; done
