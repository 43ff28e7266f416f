"""Large request bodies do not block the HTTP event loop (a real server on loopback).

Cases (all run; exit 1 if any failed):
- 20 concurrent 8 MB /v1/completions bodies while /health is polled: every large request
  gets an answer (400: longer than the context, found without tokenizing megabytes; or 503
  with Retry-After beyond --max-inflight-request-bytes), and /health keeps answering fast
  (printed: median and max latency);
- the same with 8 MB chat bodies;
- a prompt just under the context still works, and one token over is refused with the
  context length in the message.
Usage: large_bodies_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

from serve_harness import case, exit_code, free_port, launch

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


def start(*flags):
    port = free_port()
    p, _ = launch([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                   "--kv-cache-memory", "64MiB", "--max-model-len", "2048", *flags])
    return p, port


def post(port, path, body_bytes):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body_bytes,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def health_latency_under_load(path, make_body):
    p, port = start("--max-body-bytes", str(16 << 20), "--max-inflight-request-bytes", "64MiB")
    try:
        body = make_body()
        results = []
        stop = threading.Event()
        latencies = []

        def poll():
            while not stop.is_set():
                t = time.monotonic()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                    assert r.status == 200
                latencies.append(time.monotonic() - t)
                time.sleep(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(0.2)
        senders = [threading.Thread(target=lambda: results.append(post(port, path, body)))
                   for _ in range(20)]
        for s in senders:
            s.start()
        for s in senders:
            s.join(timeout=180)
        time.sleep(0.2)
        stop.set()
        poller.join(timeout=30)
        assert len(results) == 20, f"{len(results)} of 20 large requests answered"
        statuses = sorted(r[0] for r in results)
        for status, text, headers in results:
            assert status in (400, 503), f"status {status}: {text[:200]}"
            if status == 400:
                assert "maximum context length is 2048" in text, text[:300]
            else:
                assert headers.get("Retry-After") == "1", headers
        median = statistics.median(latencies) * 1000
        worst = max(latencies) * 1000
        print(f"  {path}: answers {statuses.count(400)} x 400, {statuses.count(503)} x 503; "
              f"/health over {len(latencies)} polls: median {median:.1f} ms, max {worst:.1f} ms",
              flush=True)
        assert worst < 100, f"/health took {worst:.0f} ms under the large-body load"
    finally:
        p.terminate()
        p.wait(timeout=60)


def large_completions():
    text = ("The kernel and the shell talk to each other. " * 200000)[: 8 << 20]
    health_latency_under_load("/v1/completions", lambda: json.dumps(
        {"model": "peerserve-dsv3-tiny", "prompt": text, "max_tokens": 1}).encode())


def large_chats():
    text = ("Tell me about the kernel. " * 400000)[: 8 << 20]
    health_latency_under_load("/v1/chat/completions", lambda: json.dumps(
        {"model": "peerserve-dsv3-tiny", "max_tokens": 1,
         "messages": [{"role": "user", "content": text}]}).encode())


def context_boundary():
    p, port = start()
    try:
        def tokens(text):
            status, body, _ = post(port, "/tokenize", json.dumps(
                {"model": "peerserve-dsv3-tiny", "prompt": text}).encode())
            assert status == 200, body
            return json.loads(body)["count"]
        unit = "kernel "
        per = tokens(unit * 100) / 100
        n = int(2000 / per)
        text = unit * n
        while tokens(text) >= 2048:
            text = text[: -len(unit)]
        status, body, _ = post(port, "/v1/completions", json.dumps(
            {"model": "peerserve-dsv3-tiny", "prompt": text, "max_tokens": 1}).encode())
        assert status == 200, f"{tokens(text)} tokens: {status} {body[:300]}"
        while tokens(text) <= 2048:
            text += unit
        status, body, _ = post(port, "/v1/completions", json.dumps(
            {"model": "peerserve-dsv3-tiny", "prompt": text, "max_tokens": 1}).encode())
        assert status == 400 and "maximum context length is 2048" in body, f"{status} {body[:300]}"
    finally:
        p.terminate()
        p.wait(timeout=60)


case("20 x 8 MB completions: answered, /health fast", large_completions)
case("20 x 8 MB chats: answered, /health fast", large_chats)
case("a prompt at the context limit works, one over is refused", context_boundary)
sys.exit(exit_code())
