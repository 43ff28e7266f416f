"""What the commands print when their output is not a terminal (a pipe, a log file).

- `generate` with stdout and stderr in one pipe: the statistics start their own line (they
  were glued to the generated text, which sat unflushed in stdout's buffer);
- the loading bar prints one final line at 100% (it ended at 67% when the MTP layer was
  not read).

usage: cli_output_test.py PEERSERVE_BINARY MODEL_DIR
"""
import subprocess
import sys

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
for f in failures:
    print("FAIL", f)
if not failures:
    print("all cases passed")
sys.exit(1 if failures else 0)
