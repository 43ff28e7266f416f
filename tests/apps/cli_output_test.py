"""What the commands print when their output is not a terminal (a pipe, a log file).

- `generate` with stdout and stderr in one pipe: the statistics start their own line (they
  were glued to the generated text, which sat unflushed in stdout's buffer);
- the loading bar prints one final line at 100% (it ended at 67% when the MTP layer was
  not read);
- a tokenizer.json with a hole in its ids (a damaged file: that token, generated, decodes to
  no text) is named in a warning, where words went missing from the output unseen;
- `tokenize --decode` prints a decoded NUL and what follows it (printf's %s stopped there).

usage: cli_output_test.py PEERSERVE_BINARY MODEL_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_harness import linked_model_copy  # noqa: E402

BIN, MODEL = sys.argv[1], sys.argv[2]
failures = []

p = subprocess.run([BIN, "generate", "--model", MODEL, "--prompt", "The kernel", "--max-tokens",
                    "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
lines = p.stdout.splitlines()
if p.returncode != 0:
    failures.append(f"generate exited {p.returncode}: {p.stdout[-400:]}")
if not any(line.startswith("prompt ") for line in lines):
    failures.append(f"the statistics do not start a line: {p.stdout[-400:]!r}")
bars = [line for line in lines if line.startswith("loading [")]
if len(bars) != 1 or " 100% " not in bars[0]:
    failures.append(f"loading lines: {bars}")
with tempfile.TemporaryDirectory() as scratch:
    damaged = linked_model_copy(MODEL, os.path.join(scratch, "m"), ("tokenizer.json",))
    with open(os.path.join(MODEL, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    gone = next(t for t, i in vocab.items() if i == 924)
    del vocab[gone]
    kept = []
    for merge in tokenizer["model"]["merges"]:
        parts = merge.split(" ") if isinstance(merge, str) else merge
        if gone not in parts and "".join(parts) != gone:
            kept.append(merge)
    tokenizer["model"]["merges"] = kept
    with open(os.path.join(damaged, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    p = subprocess.run([BIN, "generate", "--model", damaged, "--prompt-ids", "5,6,7",
                        "--max-tokens", "2", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        failures.append(f"generate on the damaged tokenizer exited {p.returncode}: "
                        f"{p.stderr[-400:]}")
    if "names no token for 1 of the ids below" not in p.stderr or "(the first: 924)" not in \
            p.stderr:
        failures.append(f"no warning about the missing id 924: {p.stderr[-400:]}")
# "a", NUL, "b" in the shipped model's byte-level vocabulary (ids from its tokenizer.json).
with open(os.path.join(MODEL, "tokenizer.json")) as f:
    vocab = json.load(f)["model"]["vocab"]
ids = ",".join(str(vocab[t]) for t in ("a", "\u0100", "b"))  # U+0100 is byte 0x00
p = subprocess.run([BIN, "tokenize", "--model", MODEL, "--decode", ids], capture_output=True,
                   timeout=60)
if p.returncode != 0 or p.stdout != b"a\x00b\n":
    failures.append(f"tokenize --decode {ids}: exit {p.returncode}, {p.stdout!r}")
for f in failures:
    print("FAIL", f)
if not failures:
    print("all cases passed")
sys.exit(1 if failures else 0)
