#!/usr/bin/env bash
# Decode throughput on the mini preset: one process (2 threads) against expert parallelism
# over 2 processes (1 thread each), each with one microbatch, with the two-microbatch pipeline
# under its measured split (the default) and with every step split, at
# batch 1, 16 and 64 (paper 000 Figure 20's shape). The four configurations run in
# interleaved rounds, so that a busy machine slows them alike; the table shows medians
# over rounds of each run's median, and each EP figure as a ratio of the single process
# with the same pipeline setting. With COPIES > 0, each round also runs EP=2 (one
# microbatch) with that many redundant EPLB experts, placed after an untimed warm-up
# (--eplb-redundant-experts). A last table gives the key ratios per round (two runs of the
# same round), whose spread shows how much of a median is the machine's drift.
#
#   bench/model/ep_decode_bench.sh BUILD_DIR [ROUNDS] [MODEL_DIR] [COPIES]
set -euo pipefail
build=${1:?usage: ep_decode_bench.sh BUILD_DIR [ROUNDS] [MODEL_DIR] [COPIES]}
rounds=${2:-3}
model=${3:-${TMPDIR:-/tmp}/peerserve_bench_mini}
copies=${4:-16}
bin=$build/bench/model/peerserve_bench_ep_decode
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[[ -f $model/config.json ]] || "$build/apps/peerserve" make-test-model --preset mini --out "$model" >&2
common=(--model "$model" --batches 1,16,64 --context 64 --steps 16 --runs 3)
out=$(mktemp -d)
# mb1: one microbatch; mb2: --microbatches 2 with the measured split (the default);
# mb2always: every step split (the pipeline's own cost or gain).
for ((r = 0; r < rounds; r++)); do
  for cfg in mb1 mb2 mb2always; do
    case $cfg in
      mb1) flags=(--microbatches 1) ;;
      mb2) flags=(--microbatches 2 --microbatch-split measured) ;;
      mb2always) flags=(--microbatches 2 --microbatch-split always) ;;
    esac
    "$bin" "${common[@]}" --threads 2 "${flags[@]}" >>"$out/single_$cfg"
    mpirun -np 2 --oversubscribe "$bin" "${common[@]}" --threads 1 --ep 2 "${flags[@]}" \
      >>"$out/ep2_$cfg"
  done
  if ((copies > 0)); then
    mpirun -np 2 --oversubscribe "$bin" "${common[@]}" --threads 1 --ep 2 --microbatches 1 \
      --eplb-redundant-experts "$copies" >>"$out/ep2_copies"
  fi
done
python3 - "$out" "$copies" <<'PY'
import re, statistics, sys, os
out = sys.argv[1]
def per_round(name):
    by_batch = {}
    for line in open(os.path.join(out, name)):
        m = re.match(r"decode batch (\d+): ([\d.]+) tok/s", line)
        if m:
            by_batch.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return by_batch
def rates(name):
    return {b: statistics.median(v) for b, v in per_round(name).items()}
cfgs = ("mb1", "mb2", "mb2always")
single = {c: rates(f"single_{c}") for c in cfgs}
ep = {c: rates(f"ep2_{c}") for c in cfgs}
print("tokens/s; mb2 = --microbatches 2 (measured split, the default), always = every step split")
print("| batch | 1 proc x 2 thr | 1 proc mb2 | 1 proc always | EP=2 x 1 thr | EP=2 mb2 | EP=2 always "
      "| EP=2 / 1 proc | mb2 / mb1 (1 proc) | mb2 / mb1 (EP=2) | always / mb1 (EP=2) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b in sorted(single["mb1"]):
    s, e = single, ep
    print(f"| {b} | {s['mb1'][b]:.1f} | {s['mb2'][b]:.1f} | {s['mb2always'][b]:.1f} | "
          f"{e['mb1'][b]:.1f} | {e['mb2'][b]:.1f} | {e['mb2always'][b]:.1f} | "
          f"{e['mb1'][b] / s['mb1'][b]:.2f}x | {s['mb2'][b] / s['mb1'][b]:.2f}x | "
          f"{e['mb2'][b] / e['mb1'][b]:.2f}x | {e['mb2always'][b] / e['mb1'][b]:.2f}x |")
copies = int(sys.argv[2])
if copies > 0:
    c = rates("ep2_copies")
    print()
    print(f"EP=2 x 1 thread, one microbatch, with {copies} redundant EPLB experts")
    print("| batch | tokens/s | / 1 proc x 2 thr | / EP=2 without copies |")
    print("|---|---|---|---|")
    for b in sorted(c):
        print(f"| {b} | {c[b]:.1f} | {c[b] / single['mb1'][b]:.2f}x | {c[b] / ep['mb1'][b]:.2f}x |")
# The machine's speed drifts between rounds; a ratio of two runs of the same round cancels
# most of that drift, so each round's ratios show the spread the medians above hide.
pairs = [("EP=2 / 1 proc", "ep2_mb1", "single_mb1"),
         ("mb2 / mb1 (EP=2)", "ep2_mb2", "ep2_mb1")]
if copies > 0:
    pairs += [("EP=2 + copies / 1 proc", "ep2_copies", "single_mb1"),
              ("copies / no copies", "ep2_copies", "ep2_mb1")]
print()
print("Per round (each ratio of two runs of the same round; median [lowest..highest])")
print("| batch | " + " | ".join(p[0] for p in pairs) + " |")
print("|---|" + "---|" * len(pairs))
data = {f: per_round(f) for p in pairs for f in p[1:]}
for b in sorted(data["single_mb1"]):
    cells = []
    for _, num, den in pairs:
        r = [x / y for x, y in zip(data[num][b], data[den][b])]
        cells.append(f"{statistics.median(r):.2f}x [{min(r):.2f}..{max(r):.2f}]")
    print(f"| {b} | " + " | ".join(cells) + " |")
PY
rm -rf "$out"
