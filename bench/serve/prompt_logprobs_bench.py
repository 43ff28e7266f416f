#!/usr/bin/env python3
"""What scoring a text costs against computing the same prompt, side by side.

  bench/serve/prompt_logprobs_bench.py build/apps/peerserve models/peerserve-dsv3-tiny \
      [PROMPT_TOKENS] [RUNS]

Starts `peerserve serve --no-prefix-caching` (every request computes its whole prompt) and
times, alternating, one request of each kind on the same random prompt of PROMPT_TOKENS
(default 512) token ids:
- prefill: max_tokens 1 (the prompt, then one token: the LM head on the last row only);
- score:   echo, logprobs 5, max_tokens 0 (the LM head and a log-softmax on every row);
- score + prompt_logprobs 5 (vLLM's form besides).
Prints the median latency of RUNS (default 7) of each and its ratio to prefill.
"""
import json
import random
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/tests/serve")
from serve_harness import free_port, launch, stop_all  # noqa: E402

if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
    sys.exit("usage: prompt_logprobs_bench.py PEERSERVE_BINARY MODEL_DIR [PROMPT_TOKENS] [RUNS]\n" + __doc__)
BIN, MODEL = sys.argv[1], sys.argv[2]
PROMPT_TOKENS = int(sys.argv[3]) if len(sys.argv) > 3 else 512
RUNS = int(sys.argv[4]) if len(sys.argv) > 4 else 7


def main():
    with open(MODEL + "/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    port = free_port()
    server, log = launch([BIN, "serve", "--model", MODEL, "--port", str(port),
                          "--no-prefix-caching", "--max-num-batched-tokens",
                          str(max(2048, PROMPT_TOKENS))], timeout=300)
    rng = random.Random(7)
    prompt = [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)]
    kinds = {
        "prefill": {"max_tokens": 1},
        "score": {"max_tokens": 0, "echo": True, "logprobs": 5},
        "score + prompt_logprobs": {"max_tokens": 0, "echo": True, "logprobs": 5,
                                    "prompt_logprobs": 5},
    }

    def timed(extra):
        body = json.dumps({"prompt": prompt, "temperature": 0, **extra}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        start = time.monotonic()
        with urllib.request.urlopen(req, timeout=600) as r:
            json.load(r)
        return time.monotonic() - start

    try:
        for extra in kinds.values():
            timed(extra)  # warm-up
        times = {name: [] for name in kinds}
        for _ in range(RUNS):
            for name, extra in kinds.items():
                times[name].append(timed(extra))
    finally:
        stop_all([server])
    base = statistics.median(times["prefill"])
    print(f"{MODEL}: {PROMPT_TOKENS} prompt tokens, vocabulary {vocab}, median of {RUNS}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:26s} {median * 1e3:8.1f} ms   {median / base:5.2f}x prefill")


if __name__ == "__main__":
    main()
