#!/usr/bin/env bash
# Decode throughput on the mini preset: one process (2 threads) against expert parallelism
# over 2 processes (1 thread each), each with one microbatch (mb1), with the two-microbatch
# pipeline under its measured split (mb2, the default) and with every step split (always),
# at batch 1, 16 and 64 (paper 000 Figure 20's shape).
#
# Each round runs the single process once and EP=2 once (which goes first alternates with
# the round); each of those processes runs the three pipelines in turn, run by run
# (peerserve_bench_ep_decode --pipelines), so that the pipelines are compared on runs a
# fraction of a second apart: runs in separate processes drifted by more than the
# differences looked for (a one-row step runs the same whole step under mb1 and mb2, yet
# separate processes measured mb2 at 0.83-1.05x of mb1). The tables show medians over rounds
# of each process's median, each EP figure as a ratio of the single process with the same
# pipeline. With COPIES > 0, each round also runs EP=2 (one microbatch) with that many
# redundant EPLB experts, placed after an untimed warm-up (--eplb-redundant-experts). A last
# table gives the spread: EP=2 / 1 process per round (two processes of the same round), and
# mb2 / mb1 per run (two runs of the same process in a row).
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
common=(--model "$model" --batches 1,16,64 --context 64 --steps 16 --runs 5
  --pipelines mb1,mb2,always)
out=$(mktemp -d)
for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < 2; k++)); do
    if (((k + r) % 2 == 0)); then
      "$bin" "${common[@]}" --threads 2 >>"$out/single"
    else
      mpirun -np 2 --oversubscribe "$bin" "${common[@]}" --threads 1 --ep 2 >>"$out/ep2"
    fi
  done
  if ((copies > 0)); then
    mpirun -np 2 --oversubscribe "$bin" "${common[@]}" --threads 1 --ep 2 --pipelines mb1 \
      --eplb-redundant-experts "$copies" >>"$out/ep2_copies"
  fi
done
python3 - "$out" "$copies" <<'PY'
import re, statistics, sys, os
out = sys.argv[1]
line_re = re.compile(r"decode batch (\d+) \[(\w+)\]: ([\d.]+) tok/s \(median of \d+; runs ([\d. ]+);")
def read(name):
    """{(pipeline, batch): [(process median, [run figures]) per round]}"""
    found = {}
    for line in open(os.path.join(out, name)):
        m = line_re.match(line)
        if m:
            runs = [float(x) for x in m.group(4).split()]
            found.setdefault((m.group(2), int(m.group(1))), []).append((float(m.group(3)), runs))
    return found
def rate(data, pipeline, batch):
    return statistics.median(median for median, _ in data[(pipeline, batch)])
single, ep = read("single"), read("ep2")
batches = sorted({b for _, b in single})
print("tokens/s; mb2 = --microbatches 2 (measured split, the default), always = every step split")
print("| batch | 1 proc x 2 thr | 1 proc mb2 | 1 proc always | EP=2 x 1 thr | EP=2 mb2 | EP=2 always "
      "| EP=2 / 1 proc | mb2 / mb1 (1 proc) | mb2 / mb1 (EP=2) | always / mb1 (EP=2) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b in batches:
    s = {p: rate(single, p, b) for p in ("mb1", "mb2", "always")}
    e = {p: rate(ep, p, b) for p in ("mb1", "mb2", "always")}
    print(f"| {b} | {s['mb1']:.1f} | {s['mb2']:.1f} | {s['always']:.1f} | "
          f"{e['mb1']:.1f} | {e['mb2']:.1f} | {e['always']:.1f} | "
          f"{e['mb1'] / s['mb1']:.2f}x | {s['mb2'] / s['mb1']:.2f}x | "
          f"{e['mb2'] / e['mb1']:.2f}x | {e['always'] / e['mb1']:.2f}x |")
copies = int(sys.argv[2])
if copies > 0:
    c = read("ep2_copies")
    print()
    print(f"EP=2 x 1 thread, one microbatch, with {copies} redundant EPLB experts")
    print("| batch | tokens/s | / 1 proc x 2 thr | / EP=2 without copies |")
    print("|---|---|---|---|")
    for b in batches:
        r = rate(c, "mb1", b)
        print(f"| {b} | {r:.1f} | {r / rate(single, 'mb1', b):.2f}x | "
              f"{r / rate(ep, 'mb1', b):.2f}x |")
def spread(values):
    return f"{statistics.median(values):.2f}x [{min(values):.2f}..{max(values):.2f}]"
def per_round(num, den, b):
    return [x[0] / y[0] for x, y in zip(num[("mb1", b)], den[("mb1", b)])]
def per_run(data, num, den, b):
    return [x / y for (_, xs), (_, ys) in zip(data[(num, b)], data[(den, b)])
            for x, y in zip(xs, ys)]
print()
print("Spread: EP=2 / 1 proc per round (two processes of the same round); mb2 / mb1 per run "
      "(two runs in a row in one process); median [lowest..highest]")
head = ["EP=2 / 1 proc", "mb2 / mb1 (1 proc)", "mb2 / mb1 (EP=2)"]
if copies > 0:
    head += ["EP=2 + copies / 1 proc", "copies / no copies"]
print("| batch | " + " | ".join(head) + " |")
print("|---|" + "---|" * len(head))
for b in batches:
    cells = [spread(per_round(ep, single, b)), spread(per_run(single, "mb2", "mb1", b)),
             spread(per_run(ep, "mb2", "mb1", b))]
    if copies > 0:
        cells += [spread(per_round(c, single, b)), spread(per_round(c, ep, b))]
    print(f"| {b} | " + " | ".join(cells) + " |")
PY
rm -rf "$out"
