#!/usr/bin/env bash
# Decode throughput on the mini preset: one process (2 threads) against expert parallelism
# over 2 processes (1 thread each), each with and without the two-microbatch pipeline, at
# batch 1, 16 and 64 (paper 000 Figure 20's shape). The four configurations run in
# interleaved rounds, so that a busy machine slows them alike; the table shows medians
# over rounds of each run's median, and each EP figure as a ratio of the single process
# with the same pipeline setting.
#
#   bench/model/ep_decode_bench.sh BUILD_DIR [ROUNDS] [MODEL_DIR]
set -euo pipefail
build=${1:?usage: ep_decode_bench.sh BUILD_DIR [ROUNDS] [MODEL_DIR]}
rounds=${2:-3}
model=${3:-${TMPDIR:-/tmp}/peerserve_bench_mini}
bin=$build/bench/model/peerserve_bench_ep_decode
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ -f $model/config.json ]] || "$build/apps/peerserve" make-test-model --preset mini --out "$model" >&2
common=(--model "$model" --batches 1,16,64 --context 64 --steps 16 --runs 3)
out=$(mktemp -d)
for ((r = 0; r < rounds; r++)); do
  for mb in 1 2; do
    "$bin" "${common[@]}" --threads 2 --microbatches $mb >>"$out/single_mb$mb"
    mpirun -np 2 --oversubscribe "$bin" "${common[@]}" --threads 1 --ep 2 --microbatches $mb \
      >>"$out/ep2_mb$mb"
  done
done
python3 - "$out" <<'PY'
import re, statistics, sys, os
out = sys.argv[1]
def rates(name):
    by_batch = {}
    for line in open(os.path.join(out, name)):
        m = re.match(r"decode batch (\d+): ([\d.]+) tok/s", line)
        if m:
            by_batch.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return {b: statistics.median(v) for b, v in by_batch.items()}
single = {mb: rates(f"single_mb{mb}") for mb in (1, 2)}
ep = {mb: rates(f"ep2_mb{mb}") for mb in (1, 2)}
print("| batch | 1 proc x 2 thr | 1 proc, 2 microbatches | EP=2 x 1 thr | EP=2, 2 microbatches | EP=2 / 1 proc | EP=2 mb2 / EP=2 mb1 |")
print("|---|---|---|---|---|---|---|")
for b in sorted(single[1]):
    print(f"| {b} | {single[1][b]:.1f} | {single[2][b]:.1f} | {ep[1][b]:.1f} | {ep[2][b]:.1f} | "
          f"{ep[1][b] / single[1][b]:.2f}x | {ep[2][b] / ep[1][b]:.2f}x |")
PY
rm -rf "$out"
