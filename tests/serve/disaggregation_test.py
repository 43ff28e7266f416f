"""Prefill/decode disaggregation as real processes on loopback: a `peerserve cache-server`,
`serve --role prefill` and `serve --role decode --prefill ...` over the same pool, against
the all-in-one `serve` as the reference.

Cases (all run; exit 1 if any failed):
- greedy output through prefill + decode equals the all-in-one server, completions and chat,
  streaming and not; the decode instance had the prompt prefilled remotely (metrics, cached
  tokens);
- a prefill instance whose KV namespace differs (another block size) is refused at start
  with a clear error, never a hang;
- the prefill instance killed: the decode instance still answers (it prefills locally);
- streaming sends a chunk per step, with empty text where the text is held back.
Usage: disaggregation_test.py PEERSERVE_BINARY SOURCE_DIR SCRATCH_DIR
"""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from serve_harness import free_port, stop_all  # same folder

BIN, SRC, SCRATCH = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")
os.makedirs(SCRATCH, exist_ok=True)
failures = []
children = []


def case(name, fn):
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except AssertionError as e:
        print(f"FAIL {name}: {e}", flush=True)
        failures.append(name)


def start(args, ready_marker, seconds=60):
    """Starts a child; returns (process, output lines so far) once `ready_marker` shows, or
    (process, lines) after it exited."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children.append(p)
    lines = queue.Queue()

    def pump(stream):
        for line in stream:
            lines.put(line)
        lines.put(None)
    for stream in (p.stdout, p.stderr):
        threading.Thread(target=pump, args=(stream,), daemon=True).start()
    deadline = time.monotonic() + seconds
    seen, ended = [], 0
    while time.monotonic() < deadline and ended < 2:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            ended += 1
            continue
        seen.append(line)
        if ready_marker in line:
            return p, seen
    return p, seen


def serve(port, *extra):
    p, seen = start([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                     "--kv-cache-memory", "64MiB", *extra], "serving model")
    assert p.poll() is None, f"serve {extra} exited: {''.join(seen)[-1500:]}"
    return p


def post(port, route, body, timeout=120):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if body.get("stream"):
            text = ""
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for c in chunk.get("choices", []):
                    text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            return text, None
        out = json.load(r)
        c = out["choices"][0]
        cached = (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return c.get("text") if "text" in c else c["message"]["content"], cached


def post_json(port, route, body, timeout=120):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


pool_port = free_port()
pool, seen = start([BIN, "cache-server", "--listen", f"127.0.0.1:{pool_port}", "--dram",
                    "256MiB"], "listening on")
assert pool.poll() is None, "".join(seen)
pool_flags = ["--kv-pool", f"127.0.0.1:{pool_port}"]
ref_port, prefill_port, decode_port = free_port(), free_port(), free_port()
reference = serve(ref_port)
prefill = serve(prefill_port, "--role", "prefill", *pool_flags)
decode = serve(decode_port, "--role", "decode", "--prefill", f"127.0.0.1:{prefill_port}",
               *pool_flags)

LONG = "The kernel documentation describes how the scheduler balances load across CPUs. " * 6
REQUESTS = [  # distinct from their first block on, so each needs its own prefill
    ("/v1/completions", {"prompt": "One. " + LONG, "max_tokens": 16}),
    ("/v1/completions", {"prompt": "Two. " + LONG, "max_tokens": 12, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Three. " + LONG}],
                              "max_tokens": 12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Four. " + LONG}],
                              "max_tokens": 12, "stream": True}),
]


def same_as_all_in_one():
    for route, body in REQUESTS:
        body = dict(body, model="peerserve-dsv3-tiny", temperature=0)
        want, _ = post(ref_port, route, body)
        got, cached = post(decode_port, route, body)
        assert got == want, f"{route} stream={body.get('stream')}: {got!r} != {want!r}"
        if cached is not None:
            assert cached > 0, f"{route}: no cached tokens on the decode instance"
    remote = metric(decode_port, "peerserve:kv_pool_remote_prefills_total")
    failed = metric(decode_port, "peerserve:kv_pool_remote_prefill_failures_total")
    assert remote == len(REQUESTS), f"{remote} remote prefills for {len(REQUESTS)} prompts"
    assert failed == 0, f"{failed} remote prefills failed"
    per_link = metric(decode_port, "peerserve:prefill_instance_calls_total")
    assert per_link == len(REQUESTS), f"{per_link} calls on the prefill link"
    assert metric(decode_port, "peerserve:prefill_instance_up") == 1
    assert metric(decode_port, "peerserve:prefill_instance_seconds_total") > 0
    hits = metric(decode_port, "peerserve:kv_pool_hit_tokens_total")
    assert hits and hits > 0, f"decode reused {hits} handed-over tokens"
    # The KV came by the direct push into reserved blocks, not through the pool.
    received = metric(decode_port, "peerserve:kv_handoff_blocks_total")
    pushed = metric(prefill_port, "peerserve:kv_push_blocks_total")
    assert received and received * 16 == hits, f"{received} blocks pushed for {hits} tokens"
    # Pushed: the full blocks, plus each prompt's partial block (not a pool block).
    assert received < pushed <= received + len(REQUESTS), \
        f"prefill pushed {pushed} blocks, decode received {received} full ones"
    assert metric(prefill_port, "peerserve:kv_push_failures_total") == 0


def continuous_usage_in_every_chunk():
    body = {"model": "peerserve-dsv3-tiny", "prompt": "Count. " + LONG, "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{ref_port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    counts = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                counts.append(json.loads(line[6:])["usage"]["completion_tokens"])
    assert counts and counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 12, counts
    # n = 2: each chunk carries one choice and that choice's own count, as vLLM's does.
    body["n"] = 2
    req = urllib.request.Request(f"http://127.0.0.1:{ref_port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    per_choice = {0: [], 1: []}
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if not chunk["choices"]:  # include_usage's last chunk: the whole request's
                    assert chunk["usage"]["completion_tokens"] == 24, chunk
                    continue
                assert len(chunk["choices"]) == 1, chunk
                per_choice[chunk["choices"][0]["index"]].append(chunk["usage"]["completion_tokens"])
    for index, counts in per_choice.items():
        assert counts == sorted(counts) and counts[-1] == 12, (index, counts)
    # Without include_usage no chunk carries usage (vLLM's should_include_usage).
    body["n"] = 1
    body["stream_options"] = {"continuous_usage_stats": True}
    req = urllib.request.Request(f"http://127.0.0.1:{ref_port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    chunks = 0
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
                assert "usage" not in json.loads(line[6:]), line
    assert chunks >= 1


def held_back_text_still_streams_a_chunk_per_step():
    # The text of the last tokens is held back (it could be the start of the stop string, which
    # never completes): each of those steps still streams a chunk, with empty text, as vLLM does.
    body = {"model": "peerserve-dsv3-tiny", "prompt": "Count. " + LONG, "max_tokens": 12,
            "temperature": 0, "ignore_eos": True, "logprobs": 0}
    full = post_json(ref_port, "/v1/completions", body)["choices"][0]
    text, offsets = full["text"], full["logprobs"]["text_offset"]
    assert len(offsets) == 12 and text[offsets[-4]:], (text, offsets)
    body.pop("logprobs")
    body.update({"stream": True, "stop": [text[offsets[-4]:] + "\u0001"],
                 "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    req = urllib.request.Request(f"http://127.0.0.1:{ref_port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    texts, counts = [], []
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    texts.append(chunk["choices"][0]["text"])
                    counts.append(chunk["usage"]["completion_tokens"])
    assert counts == list(range(1, 13)), f"one chunk per token expected, got counts {counts}"
    assert "".join(texts) == text, f"{''.join(texts)!r} != {text!r}"
    assert "" in texts[-4:-1], f"no held-back step in {texts}"


def prompt_logprobs_computed_on_the_decode_instance():
    # A prompt owing logprobs is computed where its logits are: the decode instance does not
    # ask a prefill instance (whose KV carries no logits) and answers as the all-in-one server.
    body = {"model": "peerserve-dsv3-tiny", "prompt": "Five. " + LONG, "max_tokens": 0,
            "echo": True, "logprobs": 2, "prompt_logprobs": 1}
    remote = metric(decode_port, "peerserve:kv_pool_remote_prefills_total")
    want = post_json(ref_port, "/v1/completions", body)
    got = post_json(decode_port, "/v1/completions", body)
    for key in ("text", "logprobs", "prompt_logprobs"):
        assert got["choices"][0][key] == want["choices"][0][key], f"{key} differs"
    assert got["choices"][0]["logprobs"]["token_logprobs"][0] is None
    after = metric(decode_port, "peerserve:kv_pool_remote_prefills_total")
    assert after == remote, f"remote prefills {remote} -> {after} for a prompt owing logprobs"


def push_refused_outside_prefill_role():
    body = {"model": "peerserve-dsv3-tiny", "prompt": [1, 2, 3], "max_tokens": 1,
            "peerserve_kv_push": {"endpoint": "127.0.0.1:9", "transfer": "handoff-x-1"}}
    try:
        post(ref_port, "/v1/completions", body)
    except urllib.error.HTTPError as e:
        error = json.load(e)["error"]
        assert e.code == 400 and error["param"] == "peerserve_kv_push", error
        return
    raise AssertionError("an all-in-one server accepted peerserve_kv_push")


def mismatched_pair_refused():
    other = free_port()
    odd = serve(other, "--role", "prefill", "--block-size", "32", *pool_flags)
    p, seen = start([BIN, "serve", "--model", MODEL, "--port", str(free_port()), "--threads",
                     "1", "--kv-cache-memory", "64MiB", "--role", "decode", "--prefill",
                     f"127.0.0.1:{other}", *pool_flags], "serving model", seconds=60)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("a decode instance with a mismatched prefill instance started")
    text = "".join(seen)
    assert p.returncode != 0, "exit 0 with a mismatched prefill instance"
    assert "KV namespace" in text and "block" in text, f"unclear error: {text[-1000:]}"
    odd.send_signal(signal.SIGTERM)


def quantized_pair_refused():
    # INT8 at load computes other KV than the stored BF16 weights: a decode instance with
    # --quantize int8 and a BF16 prefill instance shared one namespace (and pool blocks).
    other = free_port()
    bf16 = serve(other, "--role", "prefill", *pool_flags)
    p, seen = start([BIN, "serve", "--model", MODEL, "--port", str(free_port()), "--threads",
                     "1", "--kv-cache-memory", "64MiB", "--role", "decode", "--quantize", "int8",
                     "--prefill", f"127.0.0.1:{other}", *pool_flags], "serving model",
                    seconds=60)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("an INT8 decode instance with a BF16 prefill instance started")
    finally:
        bf16.send_signal(signal.SIGTERM)
    text = "".join(seen)
    assert p.returncode != 0, "exit 0 with a BF16 prefill instance"
    assert "KV namespace" in text and "w8a8" in text, f"unclear error: {text[-1000:]}"


def prefill_killed():
    prefill.send_signal(signal.SIGKILL)
    prefill.wait()
    body = {"model": "peerserve-dsv3-tiny", "temperature": 0, "max_tokens": 8,
            "prompt": "A different prompt about network interfaces and routes. " * 6}
    started = time.monotonic()
    want, _ = post(ref_port, "/v1/completions", body)
    got, cached = post(decode_port, "/v1/completions", body, timeout=60)
    assert got == want, f"{got!r} != {want!r}"
    assert cached == 0, f"{cached} cached tokens with the prefill instance dead"
    assert time.monotonic() - started < 30, "a dead prefill instance stalled the request"
    failed = metric(decode_port, "peerserve:kv_pool_remote_prefill_failures_total")
    assert failed and failed >= 1, f"remote prefill failures: {failed}"


try:
    case("prefill + decode give the all-in-one server's tokens (completions, chat, streams)",
         same_as_all_in_one)
    case("stream_options.continuous_usage_stats: running usage in every chunk",
         continuous_usage_in_every_chunk)
    case("a step whose text is held back still streams its chunk (empty text)",
         held_back_text_still_streams_a_chunk_per_step)
    case("prompt logprobs: computed on the decode instance, as the all-in-one server's",
         prompt_logprobs_computed_on_the_decode_instance)
    case("only a prefill instance pushes KV (peerserve_kv_push elsewhere is a 400)",
         push_refused_outside_prefill_role)
    case("a prefill instance with another KV namespace is refused at start", mismatched_pair_refused)
    case("a prefill instance computing BF16 KV for an INT8 decode instance is refused",
         quantized_pair_refused)
    case("prefill instance killed: the decode instance prefills locally", prefill_killed)
finally:
    stop_all(children)

print(f"{'all' if not failures else len(failures)} " +
      ("cases passed" if not failures else f"failed: {failures}"))
sys.exit(1 if failures else 0)
