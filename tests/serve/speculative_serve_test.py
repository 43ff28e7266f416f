"""MTP speculative decoding in `peerserve serve`, as real processes on loopback.

Cases (all run; exit 1 if any failed):
- greedy completions (plain and streamed, n=2, stop strings) from `--speculative mtp`
  (K = 1 and 2 with the default INT8 drafter, K = 1 with `--speculative-draft-quantization
  none`, K = 2 with `--microbatches 2`) equal those of `--speculative off`, token for token;
- /metrics has the spec_decode counters, and they add up (accepted <= drafted, per-position
  counts sum to the accepted total);
- a seeded sampled request reproduces across two speculative servers;
- `--speculative auto` starts and says in its log what it measured and decided (off, said,
  with `--microbatches 2`);
- the KV pool identity carries the INT8 drafter only where it changes the MTP layer (a BF16
  checkpoint, not an INT8 one), and the log names the MTP layer's precision;
- bad flags: --num-speculative-tokens 9, --speculative mtp on a checkpoint without an MTP
  layer, an unknown drafter precision, a drafter
  precision without speculation: a clear error and a non-zero exit.
Usage: speculative_serve_test.py PEERSERVE_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import urllib.request

from serve_harness import case, exit_code, free_port, launch

BIN, SRC, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


class Server:
    def __init__(self, *flags, model=MODEL):
        self.port = free_port()
        self.p, self.log = launch(
            [BIN, "serve", "--model", model, "--port", str(self.port), "--threads", "1",
             "--kv-cache-memory", "64MiB", "--max-num-batched-tokens", "64",
             *([] if "--max-num-seqs" in flags else ["--max-num-seqs", "64"]), *flags],
            timeout=120)

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            if not body.get("stream"):
                return json.load(r)
            chunks = []
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
            return chunks

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            return r.read().decode()

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()


PROMPTS = ["The GNU General Public License is a free, copyleft license for",
           "This program is distributed in the hope that it will be useful,",
           "You should have received a copy of the"]


def completions(server):
    out = []
    for prompt in PROMPTS:
        body = {"model": "peerserve-dsv3-tiny", "prompt": prompt, "max_tokens": 48,
                "temperature": 0, "ignore_eos": True, "n": 2, "logprobs": 1}
        r = server.post("/v1/completions", body)
        out.append([(c["text"], c["logprobs"]["tokens"]) for c in r["choices"]])
        body["stream"] = True
        body.pop("n")
        text = "".join(c["choices"][0]["text"] for c in server.post("/v1/completions", body)
                       if c.get("choices"))
        out.append(text)
        stop = {"model": "peerserve-dsv3-tiny", "prompt": prompt, "max_tokens": 48,
                "temperature": 0, "stop": ["the"]}
        r = server.post("/v1/completions", stop)
        out.append((r["choices"][0]["text"], r["choices"][0]["finish_reason"]))
    return out


def metric(text, name):
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} missing from /metrics"
    return total


def greedy_equal():
    off = Server("--speculative", "off")
    try:
        reference = completions(off)
    finally:
        off.stop()
    # The default INT8 drafter at K = 1 and 2, the drafter in the model's own precision, and
    # the main forward as the two-microbatch pipeline (the MTP passes after it).
    for k, drafter in (("1", []), ("2", []), ("1", ["--speculative-draft-quantization", "none"]),
                       ("2", ["--microbatches", "2", "--microbatch-split", "always"])):
        spec = Server("--speculative", "mtp", "--num-speculative-tokens", k, *drafter)
        try:
            got = completions(spec)
            m = spec.metrics()
        finally:
            spec.stop()
        for i, (a, b) in enumerate(zip(reference, got)):
            assert a == b, f"K={k}, output {i}: {b!r} != {a!r}"
        drafted = metric(m, "peerserve:spec_decode_num_draft_tokens_total")
        accepted = metric(m, "peerserve:spec_decode_num_accepted_tokens_total")
        per_pos = metric(m, "peerserve:spec_decode_num_accepted_tokens_per_pos_total")
        assert 0 < accepted <= drafted, f"K={k}: accepted {accepted} of {drafted}"
        assert per_pos == accepted, f"K={k}: per position {per_pos} != {accepted}"
        assert metric(m, "peerserve:spec_decode_enabled") == 1.0
        metric(m, "peerserve:spec_decode_acceptance_length_count")


def seeded_reproduces():
    texts = []
    for _ in range(2):
        spec = Server("--speculative", "mtp", "--num-speculative-tokens", "2")
        try:
            r = spec.post("/v1/completions",
                          {"model": "peerserve-dsv3-tiny", "prompt": PROMPTS[0], "max_tokens": 40,
                           "temperature": 0.8, "top_p": 0.95, "seed": 1234, "ignore_eos": True})
            texts.append(r["choices"][0]["text"])
        finally:
            spec.stop()
    assert texts[0] == texts[1], f"{texts[0]!r} != {texts[1]!r}"


def auto_decides():
    spec = Server("--speculative", "auto", "--max-num-seqs", "4")
    try:
        decision = [l for l in spec.log if l.startswith("speculative auto: at batch")]
        assert decision, "no decision in the log: " + "".join(spec.log)
        assert decision[0].rstrip().endswith(("off", "acceptance)")), decision[0]
        r = spec.post("/v1/completions", {"model": "peerserve-dsv3-tiny", "prompt": PROMPTS[1],
                                          "max_tokens": 8, "temperature": 0})
        assert r["usage"]["completion_tokens"] == 8
    finally:
        spec.stop()
    # With two microbatches auto chooses off (its calibration times one-microbatch steps)
    # and serves.
    two = Server("--speculative", "auto", "--microbatches", "2")
    try:
        assert any("speculative auto: off (its calibration times one-microbatch steps" in l
                   for l in two.log), "".join(two.log)[-600:]
        r = two.post("/v1/completions", {"model": "peerserve-dsv3-tiny", "prompt": PROMPTS[1],
                                         "max_tokens": 8, "temperature": 0})
        assert r["usage"]["completion_tokens"] == 8
    finally:
        two.stop()


def pool_identity(*flags, model=MODEL):
    server = Server("--speculative", "mtp", "--kv-pool", "local", *flags, model=model)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/models",
                                    timeout=30) as r:
            card = json.load(r)["data"][0]
        return card["peerserve"]["kv_namespace"], "".join(server.log)
    finally:
        server.stop()


def drafter_identity():
    # BF16 checkpoint: the INT8 drafter's MTP layer writes other KV than the BF16 one, so the
    # identities differ; the log names the drafter's precision.
    int8, log = pool_identity()
    none, log_none = pool_identity("--speculative-draft-quantization", "none")
    assert "+draft-w8a8" in int8 and int8 != none, (int8, none)
    assert "the MTP layer (INT8) drafts" in log, log[-600:]
    assert "the MTP layer drafts" in log_none, log_none[-600:]
    # INT8 checkpoint with a BF16 head: the MTP layer is INT8 either way (only the head gets an
    # INT8 copy), so one identity; the log says INT8 for both.
    quantized = os.path.join(WORK, "tiny-int8")
    shutil.rmtree(quantized, ignore_errors=True)
    subprocess.run([BIN, "quantize", "--model", MODEL, "--out", quantized, "--lm-head", "bf16"],
                   check=True, capture_output=True, timeout=300)
    int8, log = pool_identity(model=quantized)
    none, log_none = pool_identity("--speculative-draft-quantization", "none", model=quantized)
    assert int8 == none and "draft" not in int8, (int8, none)
    assert "the MTP layer (INT8) drafts" in log_none, log_none[-600:]


def refused(flags, expected, model=MODEL):
    p = subprocess.run([BIN, "serve", "--model", model, "--port", "0", "--threads", "1",
                        "--kv-cache-memory", "64MiB", *flags],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0, f"{flags}: exit 0"
    assert expected in p.stderr, f"{flags}: {p.stderr[-400:]!r} lacks {expected!r}"


def bad_flags():
    refused(["--speculative", "mtp", "--num-speculative-tokens", "9"],
            "--num-speculative-tokens 9: expected 1..8")
    refused(["--speculative", "eagle"], "--speculative")
    refused(["--speculative", "mtp", "--speculative-draft-quantization", "fp4"],
            "--speculative-draft-quantization")
    refused(["--speculative-draft-quantization", "none"], "is for --speculative mtp or auto")
    no_mtp = os.path.join(WORK, "tiny-v2")
    shutil.rmtree(no_mtp, ignore_errors=True)
    subprocess.run([BIN, "make-test-model", "--preset", "tiny-v2", "--out", no_mtp], check=True,
                   capture_output=True)
    refused(["--speculative", "mtp"], "has no MTP layer", model=no_mtp)


os.makedirs(WORK, exist_ok=True)
case("greedy completions equal with and without MTP (K = 1, 2), metrics add up", greedy_equal)
case("a seeded sampled request reproduces", seeded_reproduces)
case("--speculative auto measures and decides", auto_decides)
case("the drafter's precision enters the KV pool identity only when it changes the MTP KV",
     drafter_identity)
case("bad speculative flags are refused", bad_flags)
sys.exit(exit_code())
