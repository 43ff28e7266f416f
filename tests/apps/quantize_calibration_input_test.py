"""`peerserve quantize --calib` reads only the prefix of the calibration text it needs: a
stream that never ends (a FIFO fed forever, like a large corpus piped in) must not be read
whole, and a long text is cut where it keeps its tokens (between characters, not after a
newline near its start). Before, the whole input was read and tokenized first, then cut to --calib-tokens
(~11x the file's size in memory; an endless stream never finished).

usage: quantize_calibration_input_test.py PEERSERVE_BINARY MODEL_DIR
"""
import os
import subprocess
import sys
import tempfile
import threading

BIN, MODEL = sys.argv[1], sys.argv[2]
failures = []

with tempfile.TemporaryDirectory() as tmp:
    fifo = os.path.join(tmp, "calib.txt")
    os.mkfifo(fifo)
    written = [0]

    def feed():
        # Lines forever, until quantize closes its end (BrokenPipeError).
        line = b"The kernel schedules every process on the machine's cores in turn.\n" * 64
        try:
            with open(fifo, "wb") as f:
                while True:
                    f.write(line)
                    written[0] += len(line)
        except (BrokenPipeError, OSError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        p = subprocess.run([BIN, "quantize", "--model", MODEL, "--out", os.path.join(tmp, "out"),
                            "--calib", fifo, "--pipeline", "clip", "--calib-tokens", "512"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        if p.returncode != 0:
            failures.append(f"quantize exited {p.returncode}: {p.stdout[-600:]}")
        elif "calibrating on 512 tokens" not in p.stdout:
            failures.append(f"expected 512 calibration tokens: {p.stdout[-600:]}")
        elif not os.path.exists(os.path.join(tmp, "out", "config.json")):
            failures.append("no checkpoint written")
    except subprocess.TimeoutExpired:
        failures.append(f"quantize still reading an endless stream after 120 s "
                        f"({written[0] >> 20} MiB fed)")
    # Unblock a writer still waiting for a reader (quantize failed before opening).
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass

# A text longer than the prefix read whose only newline is near its start, with characters of
# two bytes: the cut must keep the text (not end after "title") and fall between characters.
with tempfile.TemporaryDirectory() as tmp:
    calib = os.path.join(tmp, "one_line.txt")
    with open(calib, "w", encoding="utf-8") as f:
        f.write("title\n" + "Éléphant rose sur la route. " * 60000)
    assert os.path.getsize(calib) > 1 << 20
    p = subprocess.run([BIN, "quantize", "--model", MODEL, "--out", os.path.join(tmp, "out"),
                        "--calib", calib, "--pipeline", "clip", "--calib-tokens", "512"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if p.returncode != 0:
        failures.append(f"one long line: quantize exited {p.returncode}: {p.stdout[-600:]}")
    elif "calibrating on 512 tokens" not in p.stdout:
        failures.append(f"one long line: expected 512 calibration tokens: {p.stdout[-600:]}")

for f in failures:
    print("FAIL", f)
if not failures:
    print("all cases passed")
sys.exit(1 if failures else 0)
