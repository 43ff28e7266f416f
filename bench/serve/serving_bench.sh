#!/usr/bin/env bash
# Serving benchmark on the `mini` test model: `peerserve bench` against `peerserve serve`.
#   1. throughput and latency percentiles at concurrency 1, 8 and 32;
#   2. prefill saving from prefix caching: the same load at 0%, 50% and 90% shared prefix.
# Usage: bench/serve/serving_bench.sh [BUILD_DIR] [OUT_DIR]
# Writes one JSON file per run into OUT_DIR and prints a summary table. Runs are short
# (a few minutes in all on 2 cores); numbers on a shared machine are noisy.
set -euo pipefail
build=${1:-build}
out=${2:-/tmp/peerserve_serving_bench}
bin="$build/apps/peerserve"
model="$out/mini"
port=${PORT:-8321}
mkdir -p "$out"
[[ -f "$model/config.json" ]] || "$bin" make-test-model --preset mini --out "$model" --seed 1 2>/dev/null

"$bin" serve --model "$model" --port "$port" --served-model-name mini --max-num-seqs 64 \
  --max-num-batched-tokens 2048 --kv-cache-memory 1GiB --max-model-len 2048 \
  >"$out/serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do grep -q "serving model" "$out/serve.log" 2>/dev/null && break; sleep 1; done
url="http://127.0.0.1:$port"

run() {  # name, then bench flags
  local name=$1; shift
  "$bin" bench --url "$url" --no-progress --json "$out/$name.json" "$@" >"$out/$name.txt"
}

# Warm-up (page in the weights).
"$bin" bench --url "$url" --no-progress --num-prompts 2 --max-concurrency 1 --input-len 64 \
  --output-len 4 --seed 99 >/dev/null

run c1  --num-prompts 8  --max-concurrency 1  --input-len 256 --output-len 32 --seed 1
run c8  --num-prompts 16 --max-concurrency 8  --input-len 256 --output-len 32 --seed 2
run c32 --num-prompts 64 --max-concurrency 32 --input-len 256 --output-len 32 --seed 3
run p0  --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.0 --seed 10
run p50 --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.5 --seed 11
run p90 --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.9 --seed 12

/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def load(n): return json.load(open(f"{out}/{n}.json"))
print("| run | req/s | out tok/s | total tok/s | TTFT mean/p50/p90/p99 ms | TPOT mean/p50/p90/p99 ms | ITL p50/p99 ms | E2E p50/p99 ms | failed |")
print("|---|---|---|---|---|---|---|---|---|")
for n in ["c1", "c8", "c32", "p0", "p50", "p90"]:
    r = load(n)
    t, p, i, e = r["ttft"], r["tpot"], r["itl"], r["e2el"]
    print(f"| {n} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
          f"{r['total_token_throughput']:.1f} | {t['mean_ms']:.0f}/{t['p50_ms']:.0f}/{t['p90_ms']:.0f}/{t['p99_ms']:.0f} | "
          f"{p['mean_ms']:.1f}/{p['p50_ms']:.1f}/{p['p90_ms']:.1f}/{p['p99_ms']:.1f} | "
          f"{i['p50_ms']:.1f}/{i['p99_ms']:.1f} | {e['p50_ms']:.0f}/{e['p99_ms']:.0f} | {r['failed']} |")
base = load("p0")
print()
print("| shared prefix | cached prompt tokens | mean TTFT ms | TTFT vs 0% | total tok/s | throughput vs 0% |")
print("|---|---|---|---|---|---|")
for n, share in [("p0", "0%"), ("p50", "50%"), ("p90", "90%")]:
    r = load(n)
    frac = r["cached_prompt_tokens"] / max(1, r["total_input_tokens"])
    print(f"| {share} | {r['cached_prompt_tokens']} ({frac:.0%}) | {r['ttft']['mean_ms']:.0f} | "
          f"{r['ttft']['mean_ms'] / base['ttft']['mean_ms']:.2f}x | {r['total_token_throughput']:.0f} | "
          f"{r['total_token_throughput'] / base['total_token_throughput']:.2f}x |")
PY
