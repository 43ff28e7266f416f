"""Command-line values and combinations the peerserve binary must refuse, with a message
naming the flag (each was once accepted: a wrapped or clamped number, a port taken modulo
65536, a flag silently ignored). Each case also checks that the refusal comes before the
model loads (no "loading" line), since a real checkpoint takes minutes.

usage: cli_refusals_test.py PEERSERVE_BINARY MODEL_DIR
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile

BIN, MODEL = sys.argv[1], sys.argv[2]

CASES = [
    # (arguments, text the error must contain)
    (["cache-server", "--listen", "127.0.0.1:99999", "--dram", "1M"], "'99999'"),
    (["serve", "--role", "router", "--decode", "127.0.0.1:abc"], "--decode"),
    (["serve", "--model", MODEL, "--kv-pool", "127.0.0.1:70000"], "--kv-pool"),
    (["serve", "--model", MODEL, "--prefill", "127.0.0.1:8001"], "--prefill is for --role decode"),
    (["serve", "--model", MODEL, "--kv-pool", "local", "--kv-pool-ssd-dir", "/tmp/x"],
     "needs --kv-pool-ssd"),
    (["serve", "--model", MODEL, "--kv-pool", "local", "--kv-pool-dram", "1X"], "--kv-pool-dram"),
    (["serve", "--model", MODEL, "--kv-pool", "127.0.0.1:1", "--kv-pool-dram", "2GiB"],
     "are for --kv-pool local"),
    (["cache-server", "--listen", "127.0.0.1", "--dram", "1M"], "has no port"),
    # A write that fails only when the last buffer is flushed (it exited 0, the file lost).
    (["simulate", "--requests", "20", "--requests-csv", "/dev/full"], "cannot write '/dev/full'"),
    # A plain range (CLI11's PositiveNumber printed DBL_MAX's 300 digits).
    (["serve", "--model", MODEL, "--max-prefill-chunk-tokens", "-1"], "not in range 0 to 1073741824"),
    (["quantize", "--model", MODEL, "--out", "/tmp/x", "--calib", MODEL + "/config.json",
      "--calib-tokens", "0"], "not in range 1 to 4194304"),
    # 64 bytes of text per token were read into memory: 2^31 tokens asked for 128 GiB.
    (["quantize", "--model", MODEL, "--out", "/tmp/x", "--calib", MODEL + "/config.json",
      "--calib-tokens", "2147483648"], "not in range 1 to 4194304"),
    # The planner and simulator: sizes that overflowed (a budget of 2^31 never finished),
    # infinities that printed "inf us" and "-nan", unbounded reads and stated lengths.
    (["plan", "--device-budget", "2147483647"], "not in range 1 to 1048576"),
    (["plan", "--batch", "inf"], "decode batch per device must be > 0 and finite"),
    (["plan", "--model-config", "/dev/zero"], "expected a regular file"),
    (["plan", "--model", "kimi-k2", "--mtp-drafts", "1"], "has no MTP module"),
    (["simulate", "--prompt", "fixed:1e300"], "lengths must be at most 1048576 tokens"),
    (["simulate", "--requests", "2147483647"], "not in range 1 to 10000000"),
    # A text file that never ends (it was read until memory ran out).
    (["tokenize", "--model", MODEL, "--file", "/dev/zero"], "expected a regular file"),
    # A calibration text that the pipeline would not read (it was ignored, unopened).
    (["quantize", "--model", MODEL, "--out", "/tmp/x", "--calib", "/nonexistent",
      "--pipeline", "rtn"], "--pipeline rtn does not calibrate: --calib /nonexistent"),
    (["serve", "--model", MODEL, "--speculative", "auto", "--num-speculative-tokens", "2"],
     "--num-speculative-tokens is for --speculative mtp"),
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
    # Flags of another role or mode (they were ignored).
    (["serve", "--role", "router", "--decode", "127.0.0.1:1", "--ep", "4"],
     "--ep is not for --role router"),
    (["serve", "--model", MODEL, "--kv-handoff-port", "9000"], "--kv-handoff-port is not for"),
    (["serve", "--model", MODEL, "--router-read-timeout-s", "5"], "--router-read-timeout-s is"),
    (["serve", "--model", MODEL, "--kv-pool-dram", "1G"], "--kv-pool-dram requires --kv-pool"),
    (["serve", "--model", MODEL, "--kv-pool", "local", "--kv-pool-ssd", "5G"],
     "--kv-pool-ssd requires --kv-pool-ssd-dir"),
    (["serve", "--model", MODEL, "--microbatch-split", "always"],
     "--microbatch-split requires --microbatches"),
    (["serve", "--model", MODEL, "--model-cache-id", "x"], "--model-cache-id requires"),
    (["generate", "--model", MODEL, "--prompt-ids", "1", "--ep-dispatch-dtype", "bf16"],
     "--ep-dispatch-dtype requires --ep"),
    (["serve", "--model", MODEL, "--role", "decode", "--kv-pool", "local", "--prefill",
      "127.0.0.1:8001", "--prefill-timeout-ms", "-5"], "--prefill-timeout-ms: Value -5"),
    (["serve", "--role", "router", "--decode", "127.0.0.1:1", "--health-check-interval-ms", "0"],
     "--health-check-interval-ms"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--goodput", "ttft:1s"],
     "--goodput"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--request-rate", "5abc"],
     "--request-rate"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "2", "--token-range", "10:25x"],
     "--token-range"),
    # Found by a review of every flag (2026-12-01): aborts on a check or an allocation,
    # unbounded sizes, empty values that widened what a flag protects, octal and hex numbers,
    # outputs found unwritable only after the work, options ignored by a subcommand.
    (["plan", "afd", "--reproduce", "--requests-per-instance", "1e12"],
     "--requests-per-instance"),
    (["simulate", "--prefill-instances", "2147483647"], "--prefill-instances"),
    (["simulate", "--decode-instances", "100000000"], "--decode-instances"),
    (["bench", "--url", "http://127.0.0.1:1", "--input-len", "2000000000"],
     "at most 16777216"),
    (["bench", "--url", "http://127.0.0.1:1", "--num-prompts", "100000", "--input-len", "100000"],
     "1 GiB of token ids"),
    (["serve", "--model", MODEL, "--host", ""], "--host"),
    (["serve", "--model", MODEL, "--api-key", ""], "--api-key"),
    (["serve", "--model", MODEL, "--chat-template", "/tmp"], "a directory or a device"),
    (["serve", "--model", MODEL, "--max-unsent-bytes", "5x"], "--max-unsent-bytes"),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--max-tokens", "010"],
     "'010' is not a decimal integer"),
    (["cache-server", "--listen", "127.0.0.1:0", "--dram", "1M", "--block-stream-port", "0x50"],
     "not a decimal integer"),
    (["score", "--model", MODEL, "--prompt-ids", "1,2", "--out", "/nonexistent/s.json"],
     "no folder /nonexistent"),
    (["simulate", "--requests", "10", "--requests-csv", "/nonexistent/x.csv"],
     "no folder /nonexistent"),
    (["bench", "--url", "http://127.0.0.1:1", "--json", "/nonexistent/x.json"],
     "no folder /nonexistent"),
    (["plan", "--hardware", "nosuch", "afd"], "excludes --hardware"),
    (["plan", "placement", "--trace", "/dev/zero", "--experts", "256"],
     "neither a regular file nor a directory"),
    (["quantize", "--model", MODEL, "--out", "/tmp/x", "--calib", "/dev/zero"],
     "--calib /dev/zero: expected a file or a pipe"),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2,"], "'' is not a token id"),
    (["cache-server", "--listen", "127.0.0.1:0", "--dram", "1M", "--ssd-sync"],
     "--ssd-sync requires --ssd-dir"),
    (["tokenize", "--model", MODEL, "--chat", "/dev/null", "--render", "--show-tokens"],
     "--render excludes --show-tokens"),
    (["plan", "placement", "--experts", "0"], "--experts"),
    (["plan", "--tpot-slo-ms", "inf"], "--tpot-slo-ms"),
    (["bench", "--url", "http://127.0.0.1:1", "--goodput", "ttft:5", "--goodput", "ttft:50"],
     "ttft given twice"),
    (["cache-server", "--listen", "127.0.0.1:0", "--dram", "1M", "--namespace-capacity", "a=1M",
      "--namespace-capacity", "a=2M"], "namespace 'a' given twice"),
]

# A port in use and a host that does not resolve: refused before the model loads (they were
# found only after it, minutes later for a real checkpoint).
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen(1)
CASES += [
    (["serve", "--model", MODEL, "--port", str(taken.getsockname()[1])], "cannot listen on"),
    (["serve", "--model", MODEL, "--host", "no-such-host.invalid"], "--host 'no-such-host"),
]

# A checkpoint whose generation_config.json recommends a value no request may have: refused
# before loading, naming the key and the file (serve reads it for its sampling defaults).
bad_generation = tempfile.mkdtemp(prefix="cli_refusals_")
for name in os.listdir(MODEL):
    if name != "generation_config.json":
        os.symlink(os.path.join(MODEL, name), os.path.join(bad_generation, name))
with open(os.path.join(bad_generation, "generation_config.json"), "w") as f:
    f.write('{"temperature": 0.6, "top_p": 2}')
CASES += [
    (["serve", "--model", bad_generation], "generation_config.json"),
    (["serve", "--model", MODEL, "--generation-config", "hf"], "--generation-config"),
]

# Flags that only apply with another option or value (they were ignored, silently).
CASES += [
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--ep", "1", "--ep-dispatch-dtype",
      "int8"], "--ep-dispatch-dtype: applies to the exchange between expert-parallel ranks"),
    (["plan", "afd", "--values", "1,2"], "--values requires --sweep"),
    (["plan", "placement", "--experts", "8", "--hidden", "512"],
     "--hidden: applies to --cost roofline"),
]

CASES += [
    (["generate", "--model", MODEL, "--prompt-ids", "1", "--max-tokens", "5x"],
     "'5x' is not a decimal integer"),
]

# A missing model folder is said as such (generate advised "use --prompt-ids", serve said
# "not a directory"); a mistyped option is named (CLI11 said "--model is required").
CASES += [
    (["generate", "--model", "/nonexistent", "--prompt", "x"],
     "/nonexistent: no such directory (the model folder)"),
    (["serve", "--model", "/nonexistent"], "/nonexistent: no such directory (the model folder)"),
    (["tokenize", "--model", "/nonexistent", "--text", "x"],
     "/nonexistent: no such directory (the model folder)"),
    (["generate", "--modle", MODEL, "--prompt", "x"],
     "The following arguments were not expected: --modle " + MODEL),
]

# Exit statuses (README): 2 when the parser refuses the command line, 1 for an error a
# command reports once it runs. CLI11's own codes (104-114) leaked out before.
EXIT_CASES = [
    (["generate", "--model", MODEL, "--no-such-flag"], 2),
    (["serve", "--model", MODEL, "--max-num-seqs", "abc"], 2),
    (["serve", "--model", MODEL, "--max-num-seqs", "0"], 2),
    (["plan", "afd", "--convention", "other"], 2),
    (["tokenize"], 2),
    (["generate", "--modle", MODEL, "--prompt", "x"], 2),
    (["plan", "afd", "--values", "1,2"], 2),
    (["generate", "--model", MODEL, "--prompt-ids", "1,2", "--prompt", "x"], 1),
    (["tokenize", "--model", "/nonexistent", "--text", "hi"], 1),
    (["plan", "afd", "--batch", "0"], 1),
    (["quantize", "--model", MODEL, "--out", "/tmp/x", "--pipeline", "full"], 1),
    (["generate", "--help"], 0),
    (["--version"], 0),
]

failures = []
for args, expected in CASES:
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    if p.returncode not in (1, 2) or expected not in out or "loading" in out.lower():
        failures.append(f"{' '.join(args)}: exit {p.returncode}, output {out[-300:]!r}")
for args, status in EXIT_CASES:
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=60)
    if p.returncode != status:
        failures.append(f"{' '.join(args)}: exit {p.returncode}, expected {status}, "
                        f"output {(p.stdout + p.stderr)[-300:]!r}")
shutil.rmtree(bad_generation, ignore_errors=True)
for f in failures:
    print("FAIL", f)
print(f"{len(CASES) + len(EXIT_CASES) - len(failures)} of {len(CASES) + len(EXIT_CASES)} "
      "ended as expected")
sys.exit(1 if failures else 0)
