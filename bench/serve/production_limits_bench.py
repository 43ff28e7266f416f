#!/usr/bin/env python3
"""The server under the conditions of a long-running production instance, measured.

  bench/serve/production_limits_bench.py build/apps/peerserve models/peerserve-dsv3-tiny

Prints:
- drain: 32 streams running, SIGTERM: time until every stream has ended properly
  (finish_reason, [DONE]) and until the process exited (--shutdown-timeout 30);
- idle sockets: 4,000 connections that send nothing; /health latency (median, max of 20)
  while they are open (--max-connections 8192, header timeout 10 s);
- large bodies: 20 concurrent 8 MB completion bodies; /health latency while they are parsed;
- stalled stream: a client that asks for an n=16 stream and never reads; server resident
  memory before and at its peak, and whether it was dropped within 120 s
  (--max-unsent-bytes 1 MiB, then the default 8 MiB).
"""
import json
import os
import queue
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
    sys.exit("usage: production_limits_bench.py PEERSERVE_BINARY MODEL_DIR\n" + __doc__)
BIN, MODEL = sys.argv[1], sys.argv[2]
NAME = os.path.basename(os.path.normpath(MODEL))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*flags):
    port = free_port()
    p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--port", str(port), "--threads", "1",
                          "--kv-cache-memory", "256MiB", *flags],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in p.stderr], daemon=True).start()
    while True:
        line = lines.get(timeout=120)
        if "serving model" in line:
            return p, port


def health_ms(port):
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60) as r:
        r.read()
    return (time.monotonic() - t) * 1000


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int([l for l in f if l.startswith("VmRSS")][0].split()[1])


def drain():
    p, port = start("--shutdown-timeout", "30", "--max-num-seqs", "64")
    ended = []

    def stream():
        body = json.dumps({"model": NAME, "prompt": "The kernel", "max_tokens": 300,
                           "ignore_eos": True, "stream": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        finish, done = None, False
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    for c in json.loads(line[6:]).get("choices", []):
                        finish = c.get("finish_reason") or finish
        ended.append((time.monotonic(), finish, done))

    threads = [threading.Thread(target=stream) for _ in range(32)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    signalled = time.monotonic()
    p.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=120)
    code = p.wait(timeout=120)
    exited = time.monotonic()
    proper = sum(1 for _, f, d in ended if f and d)
    last = max(e[0] for e in ended) - signalled if ended else float("nan")
    print(f"drain: 32 streams, SIGTERM -> {proper}/32 ended with finish_reason and [DONE], "
          f"the last {last:.2f} s after the signal; exit {code} after {exited - signalled:.2f} s")


def idle_sockets():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))
    p, port = start("--max-connections", "8192", "--max-connections-per-client", "8192",
                    "--http-header-timeout", "10")
    socks = []
    try:
        for _ in range(4000):
            s = socket.socket()
            s.connect(("127.0.0.1", port))
            socks.append(s)
        time.sleep(0.5)
        lat = [health_ms(port) for _ in range(20)]
        print(f"idle sockets: 4,000 open; /health median {statistics.median(lat):.1f} ms, "
              f"max {max(lat):.1f} ms")
    finally:
        for s in socks:
            s.close()
        p.terminate()
        p.wait(timeout=60)


def large_bodies():
    p, port = start("--max-body-bytes", str(16 << 20), "--max-model-len", "4096")
    text = ("The kernel and the shell talk to each other. " * 200000)[: 8 << 20]
    body = json.dumps({"model": NAME, "prompt": text, "max_tokens": 1}).encode()
    lat, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            lat.append(health_ms(port))
            time.sleep(0.02)

    def send():
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=120).read()
        except urllib.error.HTTPError as e:
            e.read()

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.2)
    senders = [threading.Thread(target=send) for _ in range(20)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    poller.join()
    peak = rss_kib(p.pid)
    p.terminate()
    p.wait(timeout=60)
    print(f"large bodies: 20 x 8 MB; /health over {len(lat)} polls median "
          f"{statistics.median(lat):.1f} ms, max {max(lat):.1f} ms; server RSS after {peak / 1024:.0f} MiB")


def stalled_stream(cap):
    p, port = start("--max-unsent-bytes", cap)
    before = rss_kib(p.pid)
    body = json.dumps({"model": NAME, "prompt": "The kernel", "n": 16, "max_tokens": 20000,
                       "ignore_eos": True, "stream": True})
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(request)
    peak, dropped, deadline = before, False, time.monotonic() + 120
    while time.monotonic() < deadline and not dropped:
        peak = max(peak, rss_kib(p.pid))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            dropped = any(l.startswith("peerserve:http_slow_clients_dropped_total") and
                          float(l.split()[-1]) >= 1 for l in r.read().decode().splitlines())
        time.sleep(0.2)
    s.close()
    p.terminate()
    p.wait(timeout=60)
    print(f"stalled n=16 stream, --max-unsent-bytes {cap}: server RSS {before / 1024:.0f} MiB "
          f"before, peak {peak / 1024:.0f} MiB (+{(peak - before) / 1024:.1f} MiB); "
          f"dropped within 120 s: {dropped}")


drain()
idle_sockets()
large_bodies()
stalled_stream("1MiB")
stalled_stream("8MiB")
