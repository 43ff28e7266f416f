"""A checkpoint writer's output survives a power loss whole or not at all: make-test-model
syncs every file and the staging folder before it renames the staging folder into place,
and syncs the folder holding the new name after (base/staged_output_directory.h). Checked
on the system calls the process makes, recorded by strace with file descriptors resolved
to paths (-y).

usage: durable_publish_test.py PEERSERVE_BINARY WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

BIN, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
# strace -y prints resolved paths: compare with the resolved work folder.
WORK = os.path.realpath(WORK)
out = os.path.join(WORK, "model")
# Where tracing is not allowed (a container without ptrace), the test cannot look: skipped
# (exit 77, ctest's SKIP_RETURN_CODE), not failed.
if shutil.which("strace") is None:
    print("SKIP: no strace (scripts/install-deps.sh installs it)")
    sys.exit(77)
probe = subprocess.run(["strace", "-qq", "-e", "trace=none", "true"], capture_output=True,
                       text=True)
if probe.returncode != 0:
    print("SKIP: strace cannot trace here:", probe.stderr.strip()[:200])
    sys.exit(77)
trace = subprocess.run(
    ["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", BIN,
     "make-test-model", "--out", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    text=True, timeout=120)
failures = []
if trace.returncode != 0:
    failures.append(f"make-test-model exited {trace.returncode}: {trace.stdout[-600:]}")

events = []  # ("sync", path) or ("rename", from, to), in call order
for line in trace.stdout.splitlines():
    m = re.search(r"\bf(?:data)?sync\(\d+<([^>]*)>\)\s+= 0", line)
    if m:
        events.append(("sync", m.group(1)))
        continue
    m = re.search(r'\brename(?:at2?)?\((?:[^,]*, )?"([^"]*)", (?:[^,]*, )?"([^"]*)"', line)
    if m and re.search(r"\)\s+= 0", line):
        events.append(("rename", m.group(1), m.group(2)))

publish = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == out]
if len(publish) != 1:
    failures.append(f"expected one rename onto {out}, got events {events}")
else:
    at = publish[0]
    staging = events[at][1]
    synced_before = {e[1] for e in events[:at] if e[0] == "sync"}
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if not names:
        failures.append(f"nothing was published at {out}")
    for name in names:
        if os.path.join(staging, name) not in synced_before:
            failures.append(f"{name} was not synced before the rename")
    if staging not in synced_before:
        failures.append("the staging folder was not synced before the rename")
    if not any(e == ("sync", WORK) for e in events[at + 1:]):
        failures.append(f"the folder holding the output ({WORK}) was not synced after the rename")

for f in failures:
    print("FAIL", f)
if not failures:
    print("all cases passed")
sys.exit(1 if failures else 0)
