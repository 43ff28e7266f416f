"""Command-line values and combinations the peerserve binary must refuse, with a message
naming the flag, before it loads anything (each was once accepted: a wrapped or clamped
number, a port taken modulo 65536, a flag silently ignored).

usage: cli_refusals_test.py PEERSERVE_BINARY MODEL_DIR
"""
import subprocess
import sys

BIN, MODEL = sys.argv[1], sys.argv[2]

CASES = [
    # (arguments, text the error must contain)
    (["cache-server", "--listen", "127.0.0.1:99999", "--dram", "1M"], "'99999'"),
    (["serve", "--role", "router", "--decode", "127.0.0.1:abc"], "--decode"),
    (["serve", "--model", MODEL, "--kv-pool", "127.0.0.1:70000"], "cache pool member"),
    (["serve", "--model", MODEL, "--max-model-len", "-5"], "--max-model-len"),
    (["serve", "--model", MODEL, "--max-num-seqs", "0"], "--max-num-seqs"),
    (["serve", "--model", MODEL, "--block-size", "0"], "--block-size"),
    (["serve", "--model", MODEL, "--max-waiting-requests", "-1"], "--max-waiting-requests"),
    (["serve", "--model", MODEL, "--max-body-bytes", "0"], "--max-body-bytes"),
    (["serve", "--model", MODEL, "--max-body-bytes", "-1"], "--max-body-bytes"),
    (["serve", "--model", MODEL, "--seed", "-1"], "--seed"),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--seed", "99999999999999999999"],
     "--seed"),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--max-tokens",
      "9223372036854775807"], "--max-tokens"),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--num-speculative-tokens", "3"],
     "--num-speculative-tokens is for --speculative mtp"),
    (["make-test-model", "--preset", "tiny", "--out", "/nonexistent/x", "--seed", "-1"],
     "--seed"),
    (["quantize", "--model", MODEL, "--out", "/nonexistent/x", "--calib-rows", "5"],
     "--calib-rows requires --calib"),
    (["tokenize", "--model", MODEL, "--text", "hi", "--render"], "--render requires --chat"),
    (["tokenize", "--model", MODEL, "--text", "hi", "--skip-special"],
     "--skip-special requires --decode"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--goodput", "ttft:1s"],
     "--goodput"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--request-rate", "5abc"],
     "--request-rate"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--token-range", "10:25x"],
     "--token-range"),
]

failures = []
for args, expected in CASES:
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    if p.returncode == 0 or expected not in out:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, output {out[-300:]!r}")
for f in failures:
    print("FAIL", f)
print(f"{len(CASES) - len(failures)} of {len(CASES)} refused as expected")
sys.exit(1 if failures else 0)
