#!/usr/bin/env bash
# Serving benchmark on the `mini` test model: `peerserve bench` against `peerserve serve`.
#   1. throughput and latency percentiles at concurrency 1, 8 and 32;
#   2. prefill saving from prefix caching: the same load at 0%, 50% and 90% shared prefix,
#      at concurrency 8 and one request at a time (TTFT = prefill without queueing);
#   3. 512 concurrent streams.
# Usage: bench/serve/serving_bench.sh [BUILD_DIR] [OUT_DIR]
# Every run is repeated REPEATS times (default 3, each with its own seeds, so no repeat hits
# the prefix cache an earlier one filled); the tables show the median of each figure.
# Writes one JSON file per run into OUT_DIR. About a minute per repeat on 2 cores.
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

repeats=${REPEATS:-3}
run() {  # name, seed, then bench flags
  local name=$1 seed=$(($2 + 1000 * rep)); shift 2
  "$bin" bench --url "$url" --no-progress --json "$out/$name.$rep.json" --seed "$seed" "$@" \
    >"$out/$name.$rep.txt"
}

# Warm-up (page in the weights).
"$bin" bench --url "$url" --no-progress --num-prompts 2 --max-concurrency 1 --input-len 64 \
  --output-len 4 --seed 99 >/dev/null

for rep in $(seq 1 "$repeats"); do
  run c1 1 --num-prompts 8 --max-concurrency 1 --input-len 256 --output-len 32
  run c8 2 --num-prompts 16 --max-concurrency 8 --input-len 256 --output-len 32
  run c32 3 --num-prompts 64 --max-concurrency 32 --input-len 256 --output-len 32
  run p0 10 --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.0
  run p50 11 --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.5
  run p90 12 --num-prompts 24 --max-concurrency 8 --input-len 512 --output-len 8 --prefix-share 0.9
  # The same shares one request at a time: TTFT is then the prefill alone, without queueing.
  run s0 30 --num-prompts 8 --max-concurrency 1 --input-len 512 --output-len 8 --prefix-share 0.0
  run s50 31 --num-prompts 8 --max-concurrency 1 --input-len 512 --output-len 8 --prefix-share 0.5
  run s90 32 --num-prompts 8 --max-concurrency 1 --input-len 512 --output-len 8 --prefix-share 0.9
  # 512 streams open at once: the HTTP front end holds them while the engine steps 64 at a time.
  run c512 20 --num-prompts 512 --max-concurrency 512 --input-len 32 --output-len 16
done

/usr/bin/python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def median_of(values):
    if isinstance(values[0], dict):
        return {k: median_of([v[k] for v in values]) for k in values[0]}
    if isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
        return statistics.median(values)
    return values[0]
def load(n):
    runs = [json.load(open(f"{out}/{n}.{r}.json")) for r in range(1, repeats + 1)]
    summary = median_of(runs)
    summary["failed"] = sum(r["failed"] for r in runs)  # every failure counts, not the median
    return summary
print(f"medians of {repeats} repeats")
print("| run | req/s | out tok/s | total tok/s | TTFT mean/p50/p90/p99 ms | TPOT mean/p50/p90/p99 ms | ITL p50/p99 ms | E2E p50/p99 ms | max in flight | failed |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in ["c1", "c8", "c32", "p0", "p50", "p90", "s0", "s50", "s90", "c512"]:
    r = load(n)
    t, p, i, e = r["ttft"], r["tpot"], r["itl"], r["e2el"]
    print(f"| {n} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
          f"{r['total_token_throughput']:.1f} | {t['mean_ms']:.0f}/{t['p50_ms']:.0f}/{t['p90_ms']:.0f}/{t['p99_ms']:.0f} | "
          f"{p['mean_ms']:.1f}/{p['p50_ms']:.1f}/{p['p90_ms']:.1f}/{p['p99_ms']:.1f} | "
          f"{i['p50_ms']:.1f}/{i['p99_ms']:.1f} | {e['p50_ms']:.0f}/{e['p99_ms']:.0f} | {r['max_in_flight']} | {r['failed']} |")
print()
print("| shared prefix | concurrency | cached prompt tokens | mean TTFT ms | TTFT vs 0% | total tok/s | throughput vs 0% |")
print("|---|---|---|---|---|---|---|")
for n, share, base in [("p0", "0%", "p0"), ("p50", "50%", "p0"), ("p90", "90%", "p0"),
                       ("s0", "0%", "s0"), ("s50", "50%", "s0"), ("s90", "90%", "s0")]:
    r, base = load(n), load(base)
    frac = r["cached_prompt_tokens"] / max(1, r["total_input_tokens"])
    print(f"| {share} | {r['config']['max_concurrency']} | {r['cached_prompt_tokens']} ({frac:.0%}) | {r['ttft']['mean_ms']:.0f} | "
          f"{r['ttft']['mean_ms'] / base['ttft']['mean_ms']:.2f}x | {r['total_token_throughput']:.0f} | "
          f"{r['total_token_throughput'] / base['total_token_throughput']:.2f}x |")
PY
