"""The router role (`serve --role router`) as real processes on loopback: a cache-server,
a prefill instance, two decode instances and the router in front, against the all-in-one
`serve` as the reference; a fake instance in this process for what a real one never sends.

Cases (all run; exit 1 if any failed):
- greedy output through router + prefill + decode equals the all-in-one server, completions
  and chat, streaming and not; requests spread over both decode instances;
- 256 concurrent streams through router + 1 prefill + 2 decode: every stream ends with
  [DONE] and the tokens of a request made alone;
- a client that goes away mid-stream: the decode instance stops that request;
- a decode instance killed mid-stream: that stream ends with an error event and [DONE]; new
  requests go to the survivor; the instance rejoins when it is back;
- malformed replies, a reply cut off mid-stream, a silent instance: clear errors (502), the
  router keeps serving;
- an instance serving another model is refused at start; no instance up: 503;
- `--prefill` on the router: each request names the least loaded prefill instance, the
  decode instance calls it (and ignores a name outside its own list); a prefill instance of
  another model is refused at start;
- SIGTERM to the router past its --shutdown-timeout: the streams left end with an error
  event and [DONE].
Usage: router_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import case, exit_code, free_port, launch, stop_all  # noqa: E402

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")
NAME = "peerserve-dsv3-tiny"
children = []


def spawn(cmd, ready):
    p, log = launch(cmd, ready=ready, timeout=90)
    children.append(p)
    return p, log


def serve(port, *extra, model=MODEL):
    return spawn([BIN, "serve", "--model", model, "--port", str(port), "--threads", "1",
                  "--kv-cache-memory", "64MiB", *extra], "serving model")[0]


def router(port, decode_ports, *extra):
    members = ",".join(f"127.0.0.1:{p}" for p in decode_ports)
    return spawn([BIN, "serve", "--role", "router", "--decode", members, "--port", str(port),
                  "--health-check-interval-ms", "300", *extra], "role router")


def request(port, route, body, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(f"http://127.0.0.1:{port}{route}", data,
                                  {"Content-Type": "application/json"})


def post(port, route, body, timeout=120):
    """The generated text (streams: joined deltas; the last event must be [DONE])."""
    with urllib.request.urlopen(request(port, route, body), timeout=timeout) as r:
        if body.get("stream"):
            text, done, events = "", False, []
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                events.append(line)
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                assert "error" not in chunk, f"error event: {chunk}"
                for c in chunk.get("choices", []):
                    text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            assert done, f"stream ended without [DONE]: {events[-3:]}"
            return text
        out = json.load(r)
        c = out["choices"][0]
        return c.get("text") if "text" in c else c["message"]["content"]


def status_of(port, route, body=None, timeout=30):
    try:
        with urllib.request.urlopen(request(port, route, body), timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(port, name, labels=""):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + labels + " ") or (not labels and line.startswith(name + "{")):
                return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


# --- the deployment: pool, prefill, two decode instances, router; the reference ---------
pool_port = free_port()
# (the cache server says it is ready on stdout; the harness reads stderr)
spawn(["sh", "-c", f'exec "{BIN}" cache-server --listen 127.0.0.1:{pool_port} --dram 256MiB 1>&2'],
      "listening on")
pool_flags = ["--kv-pool", f"127.0.0.1:{pool_port}"]
ref_port, prefill_port = free_port(), free_port()
decode_ports = [free_port(), free_port()]
reference = serve(ref_port)
prefill = serve(prefill_port, "--role", "prefill", *pool_flags)


def start_decode(port):
    return serve(port, "--role", "decode", "--prefill", f"127.0.0.1:{prefill_port}", *pool_flags)


decodes = [start_decode(p) for p in decode_ports]
router_port = free_port()
router_process, router_log = router(router_port, decode_ports)

LONG = "The kernel documentation describes how the scheduler balances load across CPUs. " * 4


def same_as_all_in_one():
    requests = [
        ("/v1/completions", {"prompt": "One. " + LONG, "max_tokens": 12}),
        ("/v1/completions", {"prompt": "Two. " + LONG, "max_tokens": 12, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Three. " + LONG}],
                                  "max_tokens": 12}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Four. " + LONG}],
                                  "max_tokens": 12, "stream": True}),
    ]
    for route, body in requests:
        body = dict(body, model=NAME, temperature=0)
        want = post(ref_port, route, body)
        got = post(router_port, route, body)
        assert got == want, f"{route} stream={body.get('stream')}: {got!r} != {want!r}"
    code, models = status_of(router_port, "/v1/models")
    assert code == 200 and NAME in models, f"/v1/models through the router: {code} {models}"
    sent = [metric(router_port, "peerserve:router_backend_requests_total",
                   f'{{backend="127.0.0.1:{p}"}}') for p in decode_ports]
    assert all(s and s > 0 for s in sent), f"requests per decode instance: {sent}"
    remote = sum(metric(p, "peerserve:kv_pool_remote_prefills_total") or 0 for p in decode_ports)
    assert remote >= len(requests), f"{remote} remote prefills for {len(requests)} prompts"


def many_streams():
    n = 256
    prompts = [f"Stream {i}: the scheduler and the network stack." for i in range(8)]
    want = {p: post(ref_port, "/v1/completions",
                    {"model": NAME, "prompt": p, "max_tokens": 6, "temperature": 0})
            for p in prompts}
    results, errors = [None] * n, []

    def one(i):
        try:
            p = prompts[i % len(prompts)]
            results[i] = (p, post(router_port, "/v1/completions",
                                  {"model": NAME, "prompt": p, "max_tokens": 6,
                                   "temperature": 0, "stream": True}, timeout=300))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"{i}: {e!r}")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "streams still open after 300 s"
    assert not errors, f"{len(errors)} of {n} streams failed: {errors[:3]}"
    wrong = [r for r in results if r is None or r[1] != want[r[0]]]
    assert not wrong, f"{len(wrong)} of {n} streams differ from the request made alone"
    assert metric(router_port, "peerserve:router_requests_in_flight") == 0


def open_stream(port, prompt, max_tokens):
    """A raw streaming request; returns the socket after the first event arrived."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = json.dumps({"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before the first event: {got!r}"
        got += chunk
    return s, got


def client_gone():
    # 30,000 tokens take the tiny model well over 5 s: stopping within 3 s is the abort.
    s, _ = open_stream(router_port, "A long answer about file systems.", 30000)
    running = lambda: sum(metric(p, "peerserve:num_requests_running") or 0 for p in decode_ports)
    # The engines' metrics are snapshots taken between steps: on a loaded machine the one
    # read right after the first event can predate the request's admission.
    wait_for(lambda: running() >= 1, 10, "a request running on the decode instances")
    s.close()
    wait_for(lambda: running() == 0, 3, "the decode instance stops the abandoned request")
    wait_for(lambda: metric(router_port, "peerserve:router_requests_in_flight") == 0, 10,
             "the router forgets the abandoned request")


def decode_killed():
    s, got = open_stream(router_port, "Another long answer, about memory management.", 30000)
    busy = [p for p in decode_ports
            if (metric(router_port, "peerserve:router_backend_requests_in_flight",
                       f'{{backend="127.0.0.1:{p}"}}') or 0) > 0]
    assert len(busy) == 1, f"in flight per instance: {busy}"
    victim = decode_ports.index(busy[0])
    decodes[victim].send_signal(signal.SIGKILL)
    decodes[victim].wait()
    started = time.monotonic()
    s.settimeout(30)
    while b"data: [DONE]" not in got:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    text = got.decode(errors="replace")
    assert "backend_failed" in text and "data: [DONE]" in text, f"stream ended: {text[-400:]}"
    assert time.monotonic() - started < 20, "the broken stream took too long to end"
    # New requests go to the survivor at once (the dead one failed or is down).
    for i in range(4):
        body = {"model": NAME, "prompt": f"After the loss {i}.", "max_tokens": 4, "temperature": 0}
        assert post(router_port, "/v1/completions", body, timeout=30) == \
            post(ref_port, "/v1/completions", body)
    up = f'{{backend="127.0.0.1:{busy[0]}"}}'
    assert metric(router_port, "peerserve:router_backend_up", up) == 0
    # Back on the same port: it rejoins the rotation.
    decodes[victim] = start_decode(busy[0])
    wait_for(lambda: metric(router_port, "peerserve:router_backend_up", up) == 1, 15,
             "the restarted decode instance rejoins")
    before = metric(router_port, "peerserve:router_backend_requests_total", up)
    for i in range(4):
        post(router_port, "/v1/completions",
             {"model": NAME, "prompt": f"Rejoined {i}.", "max_tokens": 2, "temperature": 0})
    assert metric(router_port, "peerserve:router_backend_requests_total", up) > before, \
        "no request went to the rejoined instance"


class FakeInstance(http.server.BaseHTTPRequestHandler):
    """Looks healthy and serves the same model card; /v1/completions misbehaves as the
    prompt asks: garbage, cut (a stream that breaks off mid-event), silent."""
    protocol_version = "HTTP/1.1"
    silent_posts = 0  # POSTs that got no answer, over every fake

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, '{"status":"ok"}')
        return self.reply(200, json.dumps({"object": "list", "data": [
            {"id": NAME, "object": "model", "owned_by": "peerserve"}]}))

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = body.get("prompt", "")
        if mode == "garbage":
            self.wfile.write(b"THIS IS NOT HTTP\r\n\r\n")
        elif mode == "cut":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n"
                             b"20\r\ndata: {\"choices\":[{\"text\":\"a\"}]\r\n")
        elif mode == "silent":
            FakeInstance.silent_posts += 1
            time.sleep(6)
        elif mode == "ok":
            return self.reply(200, json.dumps({"choices": [{"text": "fake", "index": 0}]}))
        elif mode == "trickle":  # a whole answer announced, then a byte a second
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100000\r\n\r\n")
            for _ in range(8):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    break
                time.sleep(1)
        self.wfile.flush()
        self.close_connection = True


def misbehaving_instance():
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeInstance)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeInstance)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = free_port()
    p, _ = router(port, [fake.server_address[1]], "--router-read-timeout-s", "2")
    # A failed request takes the instance out of the rotation until its next good health
    # check (every 300 ms here): wait for it before each misbehaviour.
    back = lambda: wait_for(lambda: status_of(port, "/health")[0] == 200, 10, "instance back up")
    try:
        code, text = status_of(port, "/v1/completions", {"model": NAME, "prompt": "garbage"})
        assert code == 502 and "backend_failed" in text, f"garbage: {code} {text}"
        back()
        with urllib.request.urlopen(request(port, "/v1/completions",
                                            {"prompt": "cut", "stream": True}), timeout=30) as r:
            text = r.read().decode()
        assert "backend_failed" in text and text.endswith("data: [DONE]\n\n"), f"cut: {text!r}"
        back()
        started = time.monotonic()
        code, text = status_of(port, "/v1/completions", {"model": NAME, "prompt": "silent"})
        assert code == 504 and "no answer within 2000 ms" in text and "backend_timeout" in text, \
            f"silent: {code} {text}"
        assert time.monotonic() - started < 10, "the silent instance held the request too long"
        back()
        # Each byte within the read timeout, the whole answer not: it ends at the timeout
        # (it would have taken 28 hours).
        started = time.monotonic()
        code, text = status_of(port, "/v1/completions", {"model": NAME, "prompt": "trickle"})
        assert code in (502, 504) and "backend" in text, f"trickle: {code} {text}"
        assert time.monotonic() - started < 6, "the trickling instance held the request too long"
        back()
        assert p.poll() is None, "the router exited"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
    # Two instances that take the request and stay silent (a long answer that is not
    # streamed): the request is not sent to the second one too (it was generated once per
    # instance, and the client waited for each).
    port = free_port()
    p, _ = router(port, [fake.server_address[1], other.server_address[1]],
                  "--router-read-timeout-s", "2")
    try:
        before = FakeInstance.silent_posts
        code, text = status_of(port, "/v1/completions", {"model": NAME, "prompt": "silent"})
        assert code == 504, f"silent pair: {code} {text}"
        assert FakeInstance.silent_posts - before == 1, \
            f"{FakeInstance.silent_posts - before} instances got the request"
        assert p.poll() is None, "the router exited"
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        fake.shutdown()
        other.shutdown()


class OtherModelInstance(FakeInstance):
    """Healthy, but serves another model (an instance restarted with another checkpoint)."""

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, '{"status":"ok"}')
        return self.reply(200, json.dumps({"object": "list", "data": [
            {"id": "another-model", "object": "model", "owned_by": "peerserve"}]}))

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply(200, json.dumps({"served_by": "another-model"}))


def restarted_with_another_model():
    """A decode instance that goes down and comes back on its port with another model is left
    out (its card was read once, and it answered for the router's model with its own)."""
    steady = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeInstance)
    threading.Thread(target=steady.serve_forever, daemon=True).start()
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeInstance)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    fake_port = fake.server_address[1]
    port = free_port()
    p, log = router(port, [steady.server_address[1], fake_port])
    up = f'{{backend="127.0.0.1:{fake_port}"}}'
    try:
        wait_for(lambda: metric(port, "peerserve:router_backend_up", up) == 1, 10, "fake up")
        fake.shutdown()
        fake.server_close()
        wait_for(lambda: metric(port, "peerserve:router_backend_up", up) == 0, 10, "fake down")
        other = http.server.ThreadingHTTPServer(("127.0.0.1", fake_port), OtherModelInstance)
        threading.Thread(target=other.serve_forever, daemon=True).start()
        time.sleep(1.5)  # several health checks
        assert metric(port, "peerserve:router_backend_up", up) == 0, "taken back in"
        for i in range(4):
            body = {"model": NAME, "prompt": "ok", "max_tokens": 2}
            with urllib.request.urlopen(request(port, "/v1/completions", body), timeout=30) as r:
                reply = r.read().decode()
            assert "another-model" not in reply, f"answered by the other: {reply}"
        other.shutdown()
        other.server_close()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        steady.shutdown()


def refused_and_unavailable():
    other_port = free_port()
    other = serve(other_port, model=os.path.join(SRC, "models", "peerserve-dsv3-smoke"))
    p = subprocess.run([BIN, "serve", "--role", "router", "--port", str(free_port()), "--decode",
                        f"127.0.0.1:{decode_ports[0]},127.0.0.1:{other_port}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "same model" in p.stderr, f"mixed models: {p.stderr[-600:]}"
    other.send_signal(signal.SIGTERM)
    other.wait(timeout=20)
    port = free_port()
    lone, _ = router(port, [free_port()])
    code, text = status_of(port, "/v1/completions", {"model": NAME, "prompt": "hi"})
    assert code == 503 and "no decode instance is up" in text, f"{code} {text}"
    assert status_of(port, "/health")[0] == 503
    p = subprocess.run([BIN, "serve", "--role", "router", "--model", MODEL, "--decode", "x:1"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "drop --model" in p.stderr, p.stderr
    p = subprocess.run([BIN, "serve", "--role", "router"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0 and "--decode" in p.stderr, p.stderr
    lone.send_signal(signal.SIGTERM)
    assert lone.wait(timeout=20) == 0


def with_api_key():
    """An instance and a router that share --api-key: the router's card check sends the key
    (without it the instance answered 401 and was never used), clients send it too."""
    key = "sesame"
    inst_port, front_port = free_port(), free_port()
    inst = serve(inst_port, "--api-key", key)
    front, _ = router(front_port, [inst_port], "--api-key", key)
    body = {"model": NAME, "prompt": "The kernel", "max_tokens": 4, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{front_port}/v1/completions",
                                 json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {key}"})
    got = None
    deadline = time.monotonic() + 20
    while got is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                got = json.load(r)["choices"][0]["text"]
        except urllib.error.HTTPError as e:
            assert e.code == 503, f"{e.code} {e.read().decode()[:300]}"
            time.sleep(0.3)  # not checked yet
    assert got is not None, "the instance never came up behind the router"
    assert got == post(ref_port, "/v1/completions", body), got
    assert status_of(front_port, "/v1/completions", body)[0] == 401  # no key from the client
    for p in (front, inst):
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


def labelled(port, name, endpoint):
    """The value of metric `name` whose labels include instance="endpoint" (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") and f'instance="{endpoint}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def router_suggests_prefill_instances():
    # A second prefill instance; a decode instance that knows both; a router with --prefill.
    p2_port, d3_port, r2_port = free_port(), free_port(), free_port()
    serve(p2_port, "--role", "prefill", *pool_flags)
    both = f"127.0.0.1:{prefill_port},127.0.0.1:{p2_port}"
    serve(d3_port, "--role", "decode", "--prefill", both, *pool_flags)
    _, log = router(r2_port, [d3_port], "--prefill", both)
    assert any("prefill instance" in line for line in log), "".join(log)[-800:]
    endpoints = [f"127.0.0.1:{prefill_port}", f"127.0.0.1:{p2_port}"]
    for i in range(4):  # one at a time: the router alternates between the idle instances
        body = {"model": NAME, "prompt": f"Request {i} about routing. " + LONG, "max_tokens": 6,
                "temperature": 0}
        assert post(r2_port, "/v1/completions", body) == post(ref_port, "/v1/completions", body)
    for e in endpoints:
        suggested = labelled(r2_port, "peerserve:router_prefill_requests_total", e)
        called = labelled(d3_port, "peerserve:prefill_instance_calls_total", e)
        assert suggested == 2, f"router suggested {e} {suggested} times, expected 2"
        assert called == 2, f"the decode instance called {e} {called} times, expected 2"
    # A suggestion the decode instance was not configured with is ignored (no call there).
    body = {"model": NAME, "prompt": "Another prompt, never seen. " + LONG, "max_tokens": 6,
            "temperature": 0, "peerserve_prefill": "127.0.0.1:9"}
    assert post(d3_port, "/v1/completions", body) == post(ref_port, "/v1/completions", body)
    assert sum(labelled(d3_port, "peerserve:prefill_instance_calls_total", e)
               for e in endpoints) == 5
    # A prefill instance of another model behind the router is refused at start.
    other_port = free_port()
    other = serve(other_port, model=os.path.join(SRC, "models", "peerserve-dsv3-smoke"))
    p = subprocess.run([BIN, "serve", "--role", "router", "--port", str(free_port()), "--decode",
                        f"127.0.0.1:{d3_port}", "--prefill", f"127.0.0.1:{other_port}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "prefill instance" in p.stderr and "same model" in p.stderr, \
        f"mixed models: {p.stderr[-600:]}"
    other.send_signal(signal.SIGTERM)
    other.wait(timeout=20)


def stream_events(port, body, out, key):
    try:
        with urllib.request.urlopen(request(port, "/v1/completions", body), timeout=60) as r:
            out[key] = [raw.decode().strip() for raw in r if raw.strip()]
    except Exception as e:  # noqa: BLE001
        out[key] = [f"exception: {e!r}"]


def router_shutdown_ends_streams():
    """Past the router's --shutdown-timeout the streams left end with an error event
    ("shutting_down") and [DONE] (they were cut mid-chunk, without an end)."""
    port = free_port()
    p, _ = router(port, [decode_ports[0]], "--shutdown-timeout", "1")
    body = {"model": NAME, "prompt": "The kernel", "max_tokens": 30000, "ignore_eos": True,
            "stream": True}
    out = {}
    threads = [threading.Thread(target=stream_events, args=(port, body, out, k))
               for k in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert p.wait(timeout=30) == 0, f"router exit {p.returncode}"
    assert not any(t.is_alive() for t in threads), "a stream is still open"
    assert sorted(out) == [0, 1], f"streams {sorted(out)} ended only"
    for k, events in out.items():
        assert len(events) >= 2 and events[-1] == "data: [DONE]", f"stream {k}: {events[-2:]}"
        assert "shutting_down" in events[-2], f"stream {k} ended with {events[-2][:200]}"


try:
    case("router + prefill + decode give the all-in-one server's tokens", same_as_all_in_one)
    case("256 concurrent streams through the router all end, with the right tokens",
         many_streams)
    case("a client gone mid-stream stops the request on the decode instance", client_gone)
    case("a decode instance killed mid-stream: error event, survivors serve, it rejoins",
         decode_killed)
    case("malformed, cut-off, silent and trickling replies: clear errors, the router keeps serving",
         misbehaving_instance)
    case("an instance back on its port with another model is left out",
         restarted_with_another_model)
    case("another model behind the router is refused; no instance up gives 503",
         refused_and_unavailable)
    case("router --prefill: it suggests the least loaded prefill instance, the decode "
         "instance uses it (only its own)", router_suggests_prefill_instances)
    case("router and instance with one --api-key: the router's checks send it", with_api_key)
    case("router SIGTERM past --shutdown-timeout: streams end with an error event and [DONE]",
         router_shutdown_ends_streams)
finally:
    stop_all(children)
sys.exit(exit_code())
