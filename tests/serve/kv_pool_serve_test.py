"""Context caching through a shared caching pool, as real processes on loopback: one
`peerserve cache-server` with an SSD tier and two `peerserve serve --kv-pool` engines.

Cases (all run; exit 1 if any failed):
- a long prompt served by engine A is a pool hit on engine B (cached_tokens, /metrics), and
  greedy outputs are identical with and without the hit;
- another namespace on the same pool never hits, nor an engine with a fixed attention form;
- the cache server killed with SIGKILL: requests still succeed (recomputed, no hang); the
  server restarted on the same SSD directory serves the blocks again.
Usage: kv_pool_serve_test.py PEERSERVE_BINARY SOURCE_DIR SCRATCH_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from serve_harness import free_port, stop_all  # same folder

BIN, SRC, SCRATCH = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")
failures = []
children = []


def case(name, fn):
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except AssertionError as e:
        print(f"FAIL {name}: {e}", flush=True)
        failures.append(name)


def start(args, ready_marker):
    """Starts a child, waits (60 s at most) for `ready_marker` on its stdout or stderr."""
    import queue
    import threading
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children.append(p)
    lines = queue.Queue()

    def pump(stream):  # keeps draining, so the child never blocks on a full pipe
        for line in stream:
            lines.put(line)
    for stream in (p.stdout, p.stderr):
        threading.Thread(target=pump, args=(stream,), daemon=True).start()
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if ready_marker in line:
            return p
    p.kill()
    raise AssertionError(f"{args[1]} never became ready: {''.join(seen)[-1500:]}")


def cache_server(port, ssd_dir):
    return start([BIN, "cache-server", "--listen", f"127.0.0.1:{port}", "--dram", "64MiB",
                  "--ssd-dir", ssd_dir, "--ssd", "256MiB"], "listening on")


def engine(port, pool_port, namespace="default", extra=()):
    return start([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                  "--kv-cache-memory", "64MiB", "--kv-pool", f"127.0.0.1:{pool_port}",
                  "--kv-namespace", namespace, "--kv-pool-timeout-ms", "1000", *extra],
                 "serving model")


def complete(port, prompt, max_tokens=8, timeout=60):
    body = json.dumps({"model": "peerserve-dsv3-tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.load(r)
    cached = (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return out["choices"][0]["text"], cached, out["usage"]["prompt_tokens"]


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def wait_metric(port, name, at_least, seconds=10):
    deadline = time.monotonic() + seconds
    value = None
    while time.monotonic() < deadline:
        value = metric(port, name)
        if value is not None and value >= at_least:
            return value
        time.sleep(0.1)
    return value


PROMPT_A = "The kernel documentation describes how the scheduler balances load. " * 12
PROMPT_B = "Debian packages are built from source packages with dpkg-buildpackage. " * 12

ssd = os.path.join(SCRATCH, "pool-ssd")
shutil.rmtree(ssd, ignore_errors=True)
os.makedirs(ssd)
pool_port, port_a, port_b, port_c = free_port(), free_port(), free_port(), free_port()
pool = cache_server(pool_port, ssd)
a = engine(port_a, pool_port)
b = engine(port_b, pool_port)
c = engine(port_c, pool_port, namespace="other-tenant")


def hit_on_another_engine():
    text_a, cached_a, prompt_tokens = complete(port_a, PROMPT_A)
    assert cached_a == 0, f"engine A had {cached_a} cached tokens on a cold pool"
    stored = wait_metric(port_a, "peerserve:kv_pool_blocks_stored_total", 1)
    assert stored and stored >= (prompt_tokens - 1) // 16, f"A stored {stored} blocks"
    time.sleep(0.3)  # the writes are asynchronous
    text_b, cached_b, _ = complete(port_b, PROMPT_A)
    assert cached_b >= (prompt_tokens - 1) // 16 * 16, \
        f"B: {cached_b} cached of {prompt_tokens} prompt tokens"
    assert text_b == text_a, f"outputs differ with the pool hit: {text_b!r} != {text_a!r}"
    hits = metric(port_b, "peerserve:kv_pool_hit_tokens_total")
    assert hits == cached_b, f"kv_pool_hit_tokens_total {hits} != cached_tokens {cached_b}"
    # And without any cache (another namespace computes everything): the same text.
    text_c, cached_c, _ = complete(port_c, PROMPT_A)
    assert cached_c == 0, f"another namespace hit {cached_c} tokens"
    assert text_c == text_a, f"{text_c!r} != {text_a!r}"


def fixed_attention_form_keeps_its_own_blocks():
    """A fixed --attention-form promises logits that do not depend on chunking, so it must
    not read blocks an `auto` engine computed (it did: same namespace, logprobs moved by up
    to 0.017); its namespace names the form."""
    port_f = free_port()
    engine(port_f, pool_port, extra=["--attention-form", "plain"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port_f}/v1/models", timeout=10) as r:
        identity = json.load(r)["data"][0]["peerserve"]["kv_namespace"]
    assert "+attn-plain" in identity, identity
    _, cached, _ = complete(port_f, PROMPT_A)  # engine A (auto) stored it
    assert cached == 0, f"{cached} tokens of an auto engine's blocks were hits"


def killed_pool_then_restarted():
    global pool
    complete(port_a, PROMPT_B)  # stored in the pool (and its SSD tier)
    wait_metric(port_a, "peerserve:kv_pool_blocks_stored_total", 2)
    time.sleep(0.5)
    pool.send_signal(signal.SIGKILL)
    pool.wait()
    started = time.monotonic()
    text, cached, _ = complete(port_b, PROMPT_B, timeout=30)  # pool gone: recomputed
    assert cached == 0, f"{cached} cached tokens with the pool dead"
    assert time.monotonic() - started < 20, "a dead pool stalled the request"
    text_again, _, _ = complete(port_a, PROMPT_B)
    assert text == text_again
    pool = cache_server(pool_port, ssd)  # same SSD directory: blocks recovered
    # The restarted pool must serve what A stored before the kill: ask a new engine, which
    # has nothing cached locally.
    d_port = free_port()
    engine(d_port, pool_port)
    deadline = time.monotonic() + 20
    cached_d = 0
    while time.monotonic() < deadline:  # the client retries a member it marked down
        _, cached_d, _ = complete(d_port, PROMPT_B)
        if cached_d > 0:
            break
        time.sleep(0.5)
    assert cached_d > 0, "no hit after the pool restarted on its SSD directory"


def model_cache():
    """serve --model-cache: engine E1 (checkpoint on disk) publishes it to a cache server;
    E2, started on an empty folder, fetches it from there and answers the same tokens; a
    model the pool does not hold is a clear error at start."""
    import filecmp
    weights_port = free_port()
    cache_server_port = start([BIN, "cache-server", "--listen", f"127.0.0.1:{weights_port}",
                               "--dram", "256MiB"], "listening on")
    del cache_server_port
    flags = ["--model-cache", f"127.0.0.1:{weights_port}", "--threads", "1",
             "--kv-cache-memory", "64MiB"]
    e1_port, e2_port = free_port(), free_port()
    start([BIN, "serve", "--model", MODEL, "--port", str(e1_port)] + flags,
          "model cache: published model 'peerserve-dsv3-tiny'")
    fetched = os.path.join(SCRATCH, "fetched", "peerserve-dsv3-tiny")
    shutil.rmtree(os.path.dirname(fetched), ignore_errors=True)
    start([BIN, "serve", "--model", fetched, "--port", str(e2_port)] + flags, "serving model")
    for name in sorted(os.listdir(MODEL)):
        if os.path.isfile(os.path.join(MODEL, name)):
            assert filecmp.cmp(os.path.join(MODEL, name), os.path.join(fetched, name),
                               shallow=False), f"{name} differs after the fetch"
    want, _, _ = complete(e1_port, PROMPT_B)
    got, _, _ = complete(e2_port, PROMPT_B)
    assert got == want, f"{got!r} != {want!r}"
    p = subprocess.run([BIN, "serve", "--model", os.path.join(SCRATCH, "nothing-here"),
                        "--model-cache-id", "no-such-model", "--port", str(free_port())] + flags,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no model 'no-such-model'" in p.stderr, p.stderr[-800:]


try:
    case("a prompt computed by engine A is a pool hit on engine B, same tokens",
         hit_on_another_engine)
    case("a fixed attention form does not read an auto engine's blocks",
         fixed_attention_form_keeps_its_own_blocks)
    case("cache server killed: requests recompute, no hang; restarted: hits return",
         killed_pool_then_restarted)
    case("model caching: an engine without the checkpoint loads it from the pool",
         model_cache)
finally:
    stop_all(children)

print(f"{'all' if not failures else len(failures)} " +
      ("cases passed" if not failures else f"failed: {failures}"))
sys.exit(1 if failures else 0)
