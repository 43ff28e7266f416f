"""Graceful shutdown of `peerserve serve` as a real process on loopback.

Cases (all run; exit 1 if any failed):
- SIGTERM with running streams: /health turns 503, a new request gets 503, the running
  requests finish normally (final chunk, finish_reason, [DONE]; the non-streaming one a
  whole JSON body), the process exits 0;
- past --shutdown-timeout the rest end with finish_reason "abort" and a proper end;
- a second signal exits at once;
- a request worker busy with a long template render does not keep the process alive past
  the shutdown timeout, and a second signal then still exits at once;
- an answer made before the signal but not yet read by its slow client is written out whole.
Usage: graceful_drain_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

from serve_harness import case, exit_code, free_port, launch

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


def start(timeout_s, *flags):
    port = free_port()
    p, _ = launch([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                   "--kv-cache-memory", "64MiB", "--shutdown-timeout", str(timeout_s), *flags])
    return p, port


def generate(port, max_tokens, stream, results, key):
    body = {"model": "peerserve-dsv3-tiny", "prompt": "The kernel", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            if not stream:
                out = json.load(r)
                results[key] = ("json", out["choices"][0]["finish_reason"],
                                out["usage"]["completion_tokens"])
                return
            finish, done, tokens = None, False, 0
            for raw in r:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    for c in chunk.get("choices", []):
                        tokens += 1 if c.get("text") else 0
                        finish = c.get("finish_reason") or finish
            results[key] = ("stream", finish, done)
    except Exception as e:  # noqa: BLE001
        results[key] = ("error", repr(e), None)


def status_of(port, method, route, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}",
                                 json.dumps(body).encode() if body else None,
                                 {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def start_jobs(port, max_tokens):
    results = {}
    threads = [threading.Thread(target=generate, args=(port, max_tokens, s, results, k))
               for k, s in enumerate([True, True, False])]
    for t in threads:
        t.start()
    time.sleep(1.0)  # running
    return results, threads


def drain_finishes_running_requests():
    p, port = start(60)
    try:
        results, threads = start_jobs(port, 6000)
        assert not results, f"finished before the signal: {results}"  # still running
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert status_of(port, "GET", "/health") == 503, "health not 503 while draining"
        code = status_of(port, "POST", "/v1/completions",
                         {"model": "peerserve-dsv3-tiny", "prompt": "x", "max_tokens": 1})
        assert code == 503, f"a new request got {code} while draining"
        for t in threads:
            t.join(timeout=90)
        assert p.wait(timeout=60) == 0, f"exit {p.returncode}"
        assert not any(t.is_alive() for t in threads), "a client is still waiting"
        assert sorted(results) == [0, 1, 2], f"answers of {sorted(results)} only"
        for k, r in results.items():
            if r[0] == "stream":
                assert r[1] == "length" and r[2], f"stream {k} ended {r}"
            else:
                assert r == ("json", "length", 6000), f"request {k}: {r}"
    finally:
        if p.poll() is None:
            p.kill()


def timeout_aborts_the_rest_cleanly():
    p, port = start(1)
    try:
        results, threads = start_jobs(port, 30000)
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert p.wait(timeout=30) == 0, f"exit {p.returncode}"
        assert time.monotonic() - started < 15, "drain took far past --shutdown-timeout"
        assert not any(t.is_alive() for t in threads), "a client is still waiting"
        assert sorted(results) == [0, 1, 2], f"answers of {sorted(results)} only"
        for k, r in results.items():
            if r[0] == "stream":
                assert r[1] == "abort" and r[2], f"stream {k} ended {r} (want abort + [DONE])"
            else:
                assert r[0] == "json" and r[1] == "abort", f"request {k}: {r}"
    finally:
        if p.poll() is None:
            p.kill()


def second_signal_exits_at_once():
    p, port = start(60)
    try:
        results, threads = start_jobs(port, 30000)
        p.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
        assert time.monotonic() - started < 5, "the second signal did not exit at once"
        for t in threads:
            t.join(timeout=30)
            assert not t.is_alive(), "a client hung after the exit"
    finally:
        if p.poll() is None:
            p.kill()


# A chat template whose render takes ~30 s of its step budget when asked to (a request
# worker busy with it is not a running generation, so the drain does not wait for it).
SLOW_TEMPLATE = ("{% if busy %}{% for i in range(10000) %}{% for j in range(10000) %}"
                 "{% endfor %}{% endfor %}{% endif %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")


def busy_render(port):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "chat_template_kwargs": {"busy": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60).read()
    except Exception:
        pass  # the server goes away under it


def a_busy_request_worker_does_not_hold_the_exit(second_signal):
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"slow_template_{os.getpid()}.jinja")
    with open(path, "w") as f:
        f.write(SLOW_TEMPLATE)
    p, port = start(1, "--chat-template", path)
    try:
        client = threading.Thread(target=busy_render, args=(port,), daemon=True)
        client.start()
        time.sleep(1.0)  # the worker is rendering
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        if second_signal:
            time.sleep(1.5)  # past the drain, into the teardown
            started = time.monotonic()
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=10)
            assert time.monotonic() - started < 5, "the second signal did not exit at once"
        else:
            # Drain (nothing generating), 1 s to flush, then at most 1 + 5 s for the workers.
            p.wait(timeout=20)
            assert time.monotonic() - started < 15, f"exited after {time.monotonic() - started:.1f} s"
        assert p.returncode != 0, "a teardown cut short must not exit 0"
    finally:
        if p.poll() is None:
            p.kill()
        os.unlink(path)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def a_slow_reader_gets_its_whole_answer():
    # An answer generated before the signal but not yet read by its client is written out
    # during the drain (HttpServer::stop_after_flush).
    p, port = start(30)
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills fast
        s.connect(("127.0.0.1", port))
        # About 9 MB (~560 bytes a token with 20 logprobs): more than twice what the kernel's
        # socket buffers hold (tcp_wmem's default maximum is 4 MB). 20 logprobs rather than 5
        # make it with a third of the tokens, a third of the test's time.
        body = json.dumps({"model": "peerserve-dsv3-tiny", "prompt": "The kernel", "n": 8,
                           "max_tokens": 2000, "logprobs": 20, "ignore_eos": True})
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
                metric(port, "peerserve:generation_tokens_total") < 8 * 2000 or
                metric(port, "peerserve:num_requests_running") > 0):
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the engine is idle: the drain goes straight to the end
        s.settimeout(30)
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        head, _, answer = data.partition(b"\r\n\r\n")
        length = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                  if l.lower().startswith(b"content-length:")]
        assert head.startswith(b"HTTP/1.1 200") and length, f"head: {head[:200]!r}"
        assert len(answer) == length[0], f"{len(answer)} of {length[0]} bytes arrived"
        assert p.wait(timeout=60) == 0, f"exit {p.returncode}"
    finally:
        s.close()
        if p.poll() is None:
            p.kill()


case("SIGTERM drains: running requests finish, new ones 503, exit 0",
     drain_finishes_running_requests)
case("past --shutdown-timeout the rest end with abort and a proper end",
     timeout_aborts_the_rest_cleanly)
case("a second signal exits at once", second_signal_exits_at_once)
case("a request worker busy in a template render does not hold the exit past the timeout",
     lambda: a_busy_request_worker_does_not_hold_the_exit(False))
case("nor a second signal during that teardown",
     lambda: a_busy_request_worker_does_not_hold_the_exit(True))
case("an answer made before the signal reaches its slow reader whole",
     a_slow_reader_gets_its_whole_answer)
sys.exit(exit_code())
