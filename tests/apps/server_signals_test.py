"""Signals of `peerserve serve` as a real process (apps/server_signals.h).

Cases (all run; exit 1 if any failed):
- SIGTERM or SIGINT while the model loads ends the process at once with 128 + the signal
  (they were blocked until it served: a minutes-long load could only be killed);
- a FIFO in place of the checkpoint's config.json is an error at once, not a blocked load;
- a server whose log pipe has lost its reader still drains on SIGTERM and exits 0 (SIGPIPE
  killed it with 141 and cut its streams).

usage: server_signals_test.py PEERSERVE_BINARY MODEL_DIR WORK_DIR
"""
import os
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_harness import case, exit_code, free_port, linked_model_copy  # noqa: E402

BIN, MODEL, WORK = sys.argv[1], sys.argv[2], sys.argv[3]


def signal_while_loading(sig):
    def run():
        # --chat-template names a FIFO nobody writes: the start blocks reading it (a user's
        # path may be a pipe, as with <(...); the checkpoint's own files may not, below).
        fifo = os.path.join(WORK, f"template-fifo-{sig}")
        if os.path.exists(fifo):
            os.remove(fifo)
        os.mkfifo(fifo)
        p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--chat-template", fifo,
                              "--port", str(free_port())],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert p.poll() is None, f"ended before the signal: {p.stderr.read()}"
        p.send_signal(sig)
        try:
            rc = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError("still loading 10 s after the signal")
        err = p.stderr.read()
        assert rc == 128 + sig, f"exit {rc}, expected {128 + sig}; stderr: {err[-300:]}"
        assert "while starting" in err, err[-300:]
    return run


def fifo_in_the_checkpoint():
    # A FIFO in place of config.json: a clear error at once (the load used to block forever).
    folder = linked_model_copy(MODEL, os.path.join(WORK, "fifo-model"), ("config.json",))
    os.mkfifo(os.path.join(folder, "config.json"))
    try:
        p = subprocess.run([BIN, "serve", "--model", folder, "--port", str(free_port())],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the load blocked on the FIFO")
    assert p.returncode == 1, f"exit {p.returncode}: {p.stderr[-300:]}"
    assert "config.json: a FIFO, expected a regular file" in p.stderr, p.stderr[-300:]


def sigterm_with_a_closed_log_pipe():
    port = free_port()
    reader_r, writer = os.pipe()
    p = subprocess.Popen([BIN, "serve", "--model", MODEL, "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=writer)
    os.close(writer)
    log = os.fdopen(reader_r)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = log.readline()
            if "serving" in line or not line:
                break
        assert p.poll() is None, "the server ended while starting"
        log.close()  # nobody reads its log any more
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        p.send_signal(signal.SIGTERM)  # the drain message goes to the closed pipe
        rc = p.wait(timeout=60)
        assert rc == 0, f"exit {rc} (141 is SIGPIPE)"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


os.makedirs(WORK, exist_ok=True)
case("SIGTERM while loading ends the process at once", signal_while_loading(signal.SIGTERM))
case("SIGINT while loading ends the process at once", signal_while_loading(signal.SIGINT))
case("a FIFO for the checkpoint's config.json is an error, not a hang", fifo_in_the_checkpoint)
case("a server whose log pipe lost its reader drains and exits 0", sigterm_with_a_closed_log_pipe)
sys.exit(exit_code())
