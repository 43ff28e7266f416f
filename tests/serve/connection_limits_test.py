"""Connection bounds of `peerserve serve` as a real process on loopback.

Cases (all run; exit 1 if any failed):
- idle sockets that never send a byte are closed after --http-header-timeout, and while they
  hold every slot (--max-connections), GET /health and /metrics are still answered and other
  requests get 503 (not a hang);
- one client address is capped (--max-connections-per-client);
- a flood of idle sockets past the file descriptors (RLIMIT_NOFILE lowered for the child):
  the server does not spin a core, answers /health during the flood, and serves again once
  the sockets close;
- a client that closes its side before its (non-streamed) answer is complete has left, as in
  vLLM: its request is aborted rather than generated to max_tokens; pipelined requests are
  answered in order;
- a client that stops reading its stream is dropped once --max-unsent-bytes of output is
  queued for it: its request is aborted (KV freed), memory does not pile up.
Usage: connection_limits_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import resource
import socket
import sys
import time
import urllib.error
import urllib.request

from serve_harness import case, exit_code, free_port, launch

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


def start(*extra, nofile=None):
    port = free_port()

    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    p, log = launch([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                     "--kv-cache-memory", "32MiB", *extra], preexec_fn=limit)
    return p, port, log


def status_of(port, method, route, body=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}",
                                 json.dumps(body).encode() if body else None,
                                 {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError) as e:  # timed out, refused, reset: no status
        return f"no answer ({e})"


def idle_sockets(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    return socks


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_sockets_cannot_lock_everyone_out():
    p, port, _ = start("--max-connections", "20", "--http-header-timeout", "2")
    try:
        socks = idle_sockets(port, 25)  # every slot taken, 5 over
        time.sleep(0.3)
        started = time.monotonic()
        assert status_of(port, "GET", "/health") == 200, "/health not answered at the cap"
        assert status_of(port, "GET", "/metrics") == 200, "/metrics not answered at the cap"
        code = status_of(port, "POST", "/v1/completions",
                         {"model": "peerserve-dsv3-tiny", "prompt": "a", "max_tokens": 1})
        assert code == 503, f"a completion at the cap got {code}"
        assert time.monotonic() - started < 5, "answers at the cap were slow"
        time.sleep(3)  # past the header timeout: the idle sockets are closed
        closed = 0
        for s in socks:
            s.settimeout(1)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, socket.timeout):
                closed += 1
            s.close()
        assert closed == len(socks), f"{closed} of {len(socks)} idle sockets were closed"
        code = status_of(port, "POST", "/v1/completions",
                         {"model": "peerserve-dsv3-tiny", "prompt": "a", "max_tokens": 1})
        assert code == 200, f"a completion after the idle sockets closed got {code}"
    finally:
        p.terminate()
        p.wait(timeout=30)


def one_client_is_capped():
    p, port, _ = start("--max-connections-per-client", "4", "--http-header-timeout", "30")
    try:
        socks = idle_sockets(port, 4)
        time.sleep(0.2)
        code = status_of(port, "POST", "/v1/completions",
                         {"model": "peerserve-dsv3-tiny", "prompt": "a", "max_tokens": 1})
        assert code == 503, f"a fifth connection from one address got {code}"
        assert status_of(port, "GET", "/health") == 200, "/health not answered at the cap"
        for s in socks:
            s.close()
        time.sleep(0.2)
        code = status_of(port, "POST", "/v1/completions",
                         {"model": "peerserve-dsv3-tiny", "prompt": "a", "max_tokens": 1})
        assert code == 200, f"after closing, got {code}"
    finally:
        p.terminate()
        p.wait(timeout=30)


def out_of_descriptors_backs_off():
    p, port, log = start("--http-header-timeout", "30", nofile=160)
    try:
        assert any("max connections lowered" in l for l in log), \
            f"no note about the lowered cap: {''.join(log)[-800:]}"
        socks = []
        for _ in range(300):  # far more than the descriptors the server has
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        time.sleep(0.5)
        before = cpu_seconds(p.pid)
        time.sleep(2)
        used = cpu_seconds(p.pid) - before
        assert used < 0.6, f"the server burned {used:.2f} s of CPU in 2 s while out of descriptors"
        # The flood is still open: past the cap and the probes' room, connections are closed on
        # accept, and the idle ones in that room time out after 2 s, so a probe gets through
        # (the flood used to take every descriptor: /health timed out until it closed).
        health = status_of(port, "GET", "/health", timeout=10)
        assert health == 200, f"/health during the flood: {health}"
        for s in socks:
            s.close()
        time.sleep(0.5)
        assert status_of(port, "GET", "/health", timeout=10) == 200, "no answer after the flood"
    finally:
        p.terminate()
        p.wait(timeout=30)


def raw_exchange(port, payload, half_close, wait_before_close=0.0):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(payload)
        time.sleep(wait_before_close)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        s.settimeout(30)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data.decode(errors="replace")
            data += chunk


def half_close_and_pipelining():
    p, port, _ = start()
    try:
        body = json.dumps({"model": "peerserve-dsv3-tiny", "prompt": "The kernel",
                           "max_tokens": 8, "temperature": 0})
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()
        long_body = json.dumps({"model": "peerserve-dsv3-tiny", "prompt": "The kernel", "n": 16,
                                "max_tokens": 4000, "ignore_eos": True})
        long_request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        f"application/json\r\nContent-Length: {len(long_body)}\r\n\r\n"
                        f"{long_body}").encode()
        aborted_before = metric_sum(port, "peerserve:request_success_total",
                                    'finished_reason="abort"')
        # Closed once the request runs (closed before, it is never started).
        reply = raw_exchange(port, long_request, half_close=True, wait_before_close=0.1)
        assert reply == "", f"a client that left got: {reply[:200]!r}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            aborted = metric_sum(port, "peerserve:request_success_total",
                                 'finished_reason="abort"')
            running = metric_sum(port, "peerserve:num_requests_running")
            if aborted > aborted_before and running == 0:
                break
            time.sleep(0.2)
        assert aborted == aborted_before + 1 and running == 0, \
            f"the request of a client that left: aborted {aborted - aborted_before}, " \
            f"running {running}"
        health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        last = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        reply = raw_exchange(port, request + health + last, half_close=False)
        starts = [i for i in range(len(reply)) if reply.startswith("HTTP/1.1 ", i)]
        assert len(starts) == 3, f"{len(starts)} responses to 3 pipelined requests"
        parts = [reply[a:b] for a, b in zip(starts, starts[1:] + [len(reply)])]
        assert '"finish_reason"' in parts[0] and '"status"' in parts[1] and \
            '"object":"list"' in parts[2].replace(" ", ""), f"out of order: {reply[:600]!r}"
    finally:
        p.terminate()
        p.wait(timeout=30)


def metric_sum(port, name, contains=""):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        total = 0.0
        for line in r.read().decode().splitlines():
            if line.startswith(name) and contains in line and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def slow_reader_is_dropped():
    p, port, _ = start("--max-unsent-bytes", "256KiB")
    try:
        body = json.dumps({"model": "peerserve-dsv3-tiny", "prompt": "The kernel", "n": 16,
                           "max_tokens": 20000, "ignore_eos": True, "stream": True})
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills fast
        s.connect(("127.0.0.1", port))
        s.sendall(request)  # ... and never read
        deadline = time.monotonic() + 60
        dropped = 0
        while time.monotonic() < deadline:
            dropped = metric_sum(port, "peerserve:http_slow_clients_dropped_total")
            if dropped >= 1:
                break
            time.sleep(0.5)
        assert dropped >= 1, "the client that stopped reading was never dropped"
        time.sleep(0.5)
        aborted = metric_sum(port, "peerserve:request_success_total", 'finished_reason="abort"')
        running = metric_sum(port, "peerserve:num_requests_running")
        assert aborted >= 1 and running == 0, f"aborted {aborted}, still running {running}"
        with open(f"/proc/{p.pid}/status") as f:
            rss = [l for l in f if l.startswith("VmRSS")][0]
        s.close()
        assert status_of(port, "GET", "/health") == 200
        print(f"  (server {rss.strip()})")
    finally:
        p.terminate()
        p.wait(timeout=30)


case("idle sockets are closed after the header timeout; /health and /metrics answered at the cap",
     idle_sockets_cannot_lock_everyone_out)
case("one client address is capped", one_client_is_capped)
case("a flood past the descriptors: no spinning, /health answered during it, then serves",
     out_of_descriptors_backs_off)
case("a client that closes before its answer is aborted; pipelined requests in order",
     half_close_and_pipelining)
case("a client that stops reading is dropped and its request aborted", slow_reader_is_dropped)
sys.exit(exit_code())
