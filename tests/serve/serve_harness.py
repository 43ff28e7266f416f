"""What the process-level serve tests share: named cases, a free loopback port, and starting
`peerserve serve` (or any command that prints a readiness line on stderr) and waiting for it.
"""
import queue
import random
import socket
import subprocess
import threading
import time

failures = []


def case(name, fn):
    """Runs one case; an AssertionError marks it failed and the run goes on."""
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except AssertionError as e:
        print(f"FAIL {name}: {e}", flush=True)
        failures.append(name)


def exit_code():
    """Prints the summary and returns the process exit code (1 if any case failed)."""
    print(f"{'all' if not failures else len(failures)} " +
          ("cases passed" if not failures else f"failed: {failures}"))
    return 1 if failures else 0


def free_port():
    """A loopback port free now, for a server started later. It is drawn below the kernel's
    ephemeral range: a port from that range (what bind to port 0 gives) can be taken, before
    the server binds it, as the local end of any outgoing connection on the machine, which
    made a CI run fail with "Address already in use"."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    draw = random.SystemRandom()
    if low > 11024:
        for _ in range(100):
            port = draw.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the range: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def linked_model_copy(model, folder, leave_out=()):
    """`folder` (made afresh) of symlinks to the files of the checkpoint `model`, without
    `leave_out`: a model a test can break or tell apart on a command line, the weights not
    copied."""
    import os
    import shutil
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name in os.listdir(model):
        if name not in leave_out:
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(folder, name))
    return folder


def launch(cmd, ready="serving model", timeout=60, preexec_fn=None):
    """Starts `cmd` and waits until a stderr line contains `ready`. Returns the process and
    the stderr lines read so far (the list keeps growing). Raises AssertionError, with the
    log, if the process exits or is not ready in time (then it is killed)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec_fn)
    lines, log = queue.Queue(), []
    threading.Thread(target=lambda: [lines.put(l) for l in p.stderr], daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert p.poll() is None, f"{cmd[0]} exited: {''.join(log)}"
            continue
        log.append(line)
        if ready in line:
            threading.Thread(target=lambda: [log.append(l) for l in iter(lines.get, None)],
                             daemon=True).start()
            return p, log
    p.kill()
    raise AssertionError(f"{cmd[0]} never became ready: {''.join(log)}")


def stop_all(processes, seconds=20):
    """SIGTERM to every process still running, then waits for each (SIGKILL after `seconds`)."""
    import signal
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class ServeProcess:
    """`peerserve serve --model MODEL` on a free loopback port (one thread, 64 MiB of KV, and
    `flags`), with JSON requests. Used by the tests that talk to one server at a time."""

    def __init__(self, binary, model, *flags):
        self.port = free_port()
        self.p, self.log = launch(
            [binary, "serve", "--model", model, "--port", str(self.port), "--threads", "1",
             "--kv-cache-memory", "64MiB", *flags], timeout=120)

    def post(self, path, body, stream=False):
        """(HTTP status, parsed answer); with stream, the list of SSE data chunks."""
        import json
        import urllib.error
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                if not stream:
                    return 200, json.load(r)
                chunks = []
                for raw in r:
                    line = raw.decode().strip()
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:]))
                return 200, chunks
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        stop_all([self.p])
