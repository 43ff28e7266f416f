#!/usr/bin/env python3
"""Expert parallelism end to end: `mpirun -np N peerserve generate|score --ep N` as real
processes, against the single-process engine.

  ep_cli_test.py PEERSERVE_BINARY SOURCE_DIR SCRATCH_DIR

Checks (each a separate case, all run; exit 1 if any failed):
- greedy tokens with EP=2 and EP=4 equal the single process (tiny preset and the shipped
  model), with int8 (default), bf16 and fp32 dispatch;
- with fp32 dispatch, `score` logits equal the single process (V3 and V2 variants);
  with bf16 and int8 dispatch within a stated tolerance, top-1 agreement reported;
- one request on EP=4 (three ranks idle) finishes;
- bad input: --ep not dividing the experts, --ep different from the world size, --ep
  without mpirun: a clear error and a non-zero exit on every rank, no hang;
- a rank killed mid-run: the others exit non-zero naming the lost rank within the timeout;
- speculative decoding (MTP) under --ep: greedy tokens unchanged, the idle ranks joining
  every MTP pass; `auto` is off under --ep, and says so;
- serve --ep 2 (API on rank 0, requests over both ranks), with and without --speculative
  mtp; a decode instance with --ep 2 over
  two prefill instances uses the §4.3.3 mapping (each rank its own prefill instance).
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

BIN, SRC, SCRATCH = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(SRC, "tests", "serve"))
from serve_harness import free_port, linked_model_copy, stop_all  # noqa: E402
os.makedirs(SCRATCH, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
failures = []


def run(args, timeout=120):
    started = time.monotonic()
    p = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - started


# The path across hosts on one machine: MPI one-sided puts over TCP, no shared memory.
MPI_TCP = ["--mca", "osc", "pt2pt", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include",
           "lo"]


def mpirun(n, args, timeout=120, mca=()):
    return run(["mpirun", "-np", str(n), "--oversubscribe"] + list(mca) + [BIN] + args, timeout)


def case(name, fn):
    only = os.environ.get("EP_CASE")  # run only the cases whose name contains this
    if only and only not in name:
        return
    try:
        fn()
        print(f"PASS {name}")
    except AssertionError as e:
        print(f"FAIL {name}: {e}")
        failures.append(name)
    except subprocess.TimeoutExpired as e:
        print(f"FAIL {name}: timed out after {e.timeout} s (a hang)")
        failures.append(name)


def make_model(preset):
    out = os.path.join(SCRATCH, preset)
    if not os.path.exists(os.path.join(out, "config.json")):
        args = [BIN, "make-test-model", "--preset", preset, "--out", out, "--seed", "3"]
        rc, _, err, _ = run(args)
        assert rc == 0, err
    return out


PROMPT = "1,17,42,99,3,250,7,8,19,200,33"


def generate(model, n=1, extra=(), max_tokens=12, with_stderr=False):
    args = ["generate", "--model", model, "--prompt-ids", PROMPT, "--max-tokens", str(max_tokens),
            "--ignore-eos", "--threads", "1"] + list(extra)
    if n == 1:
        rc, out, err, _ = run([BIN] + args)
    else:
        rc, out, err, _ = mpirun(n, args + ["--ep", str(n)])
    assert rc == 0, f"exit {rc}: {err[-2000:]}"
    return (out.strip(), err) if with_stderr else out.strip()


def score(model, n=1, extra=(), with_stderr=False, mca=()):
    path = os.path.join(SCRATCH, f"score-{n}-{os.getpid()}-{time.monotonic_ns()}.json")
    args = ["score", "--model", model, "--prompt-ids", PROMPT, "--out", path, "--threads", "1"]
    args += list(extra)
    if n == 1:
        rc, _, err, _ = run([BIN] + args)
    else:
        rc, _, err, _ = mpirun(n, args + ["--ep", str(n)], mca=mca)
    assert rc == 0, f"exit {rc}: {err[-2000:]}"
    with open(path) as f:
        logits = json.load(f)["logits"]
    os.remove(path)  # each is megabytes; runs of the suite piled them up in the build tree
    return (logits, err) if with_stderr else logits


def compare_logits(a, b):
    """max |a-b| / max |a| over the whole matrix, and top-1 agreement."""
    diff = scale = 0.0
    agree = 0
    for ra, rb in zip(a, b):
        diff = max(diff, max(abs(x - y) for x, y in zip(ra, rb)))
        scale = max(scale, max(abs(x) for x in ra))
        agree += ra.index(max(ra)) == rb.index(max(rb))
    return diff / scale, agree / len(a)


tiny = make_model("tiny")
shipped = os.path.join(SRC, "models", "peerserve-dsv3-tiny")


def greedy_equal(model, n, dtype):
    def check():
        single = generate(model, 1, ["--precision", "fp32"])
        multi = generate(model, n, ["--precision", "fp32", "--ep-dispatch-dtype", dtype])
        assert single == multi, f"single {single!r} != ep{n} {multi!r}"
    return check


for n in (2, 4):
    case(f"tiny greedy EP={n} fp32 dispatch", greedy_equal(tiny, n, "fp32"))
case("tiny greedy EP=2 int8 dispatch", greedy_equal(tiny, 2, "int8"))
case("shipped greedy EP=2 fp32 dispatch", greedy_equal(shipped, 2, "fp32"))
case("shipped greedy EP=4 fp32 dispatch", greedy_equal(shipped, 4, "fp32"))


def int8_checkpoint_equal():
    # An INT8 checkpoint (peerserve quantize): each rank packs its stored INT8 experts; the
    # tokens equal the single process on the same checkpoint.
    out = os.path.join(SCRATCH, "tiny-int8")
    if not os.path.exists(os.path.join(out, "config.json")):
        rc, _, err, _ = run([BIN, "quantize", "--model", tiny, "--out", out])
        assert rc == 0, err
    single = generate(out, 1, ["--precision", "fp32"])
    multi = generate(out, 2, ["--precision", "fp32", "--ep-dispatch-dtype", "fp32"])
    assert single == multi, f"single {single!r} != ep2 {multi!r}"


case("tiny INT8 checkpoint greedy EP=2: same tokens", int8_checkpoint_equal)


def eplb_unchanged():
    """Online EPLB swaps experts between steps; the tokens stay those of one process."""
    single = generate(shipped, 1, ["--precision", "fp32"], max_tokens=30)
    args = ["generate", "--model", shipped, "--prompt-ids", PROMPT, "--max-tokens", "30",
            "--ignore-eos", "--threads", "1", "--precision", "fp32", "--ep", "2",
            "--ep-dispatch-dtype", "fp32", "--eplb-interval", "8", "--eplb-redundant-experts", "2"]
    rc, out, err, _ = mpirun(2, args)
    assert rc == 0, err[-2000:]
    assert out.strip() == single, f"single {single!r} != eplb {out.strip()!r}"
    swaps = [line for line in err.splitlines() if line.startswith("eplb: step")]
    assert len(swaps) == 3, f"expected 3 rebalances in 30 steps: {swaps}"
    print("  " + "\n  ".join(swaps))


case("shipped EP=2 with online EPLB every 8 steps: same tokens", eplb_unchanged)


def score_exact(model, n):
    def check():
        single = score(model)
        multi = score(model, n, ["--ep-dispatch-dtype", "fp32"])
        rel, top1 = compare_logits(single, multi)
        assert rel == 0.0, f"fp32 dispatch differs: max rel {rel:.3g}"
        assert top1 == 1.0
    return check


def score_same_weights(model, n, extra):
    """Each rank prepares the experts it reads as one process prepares all of them (BF16
    repacked for the outer-product kernels, or W8A8 with --quantize int8): with fp32
    dispatch the logits are bit for bit those of one process with the same options. Before
    the ranks did so, on the shipped model: max relative difference 8.6e-4 (unpacked BF16
    experts on the ranks) and 2.0e-2 (BF16 experts on the ranks under --quantize int8)."""
    def check():
        single = score(model, 1, extra)
        multi = score(model, n, list(extra) + ["--ep-dispatch-dtype", "fp32"])
        rel, top1 = compare_logits(single, multi)
        assert rel == 0.0, f"{' '.join(extra)}: EP={n} differs from one process: max rel {rel:.3g}"
        assert top1 == 1.0
    return check


case("tiny V3 score EP=2 fp32 bitwise", score_exact(tiny, 2))
case("tiny V2 score EP=2 fp32 bitwise", score_exact(make_model("tiny-v2"), 2))
case("shipped score --precision bf16 EP=2 fp32 dispatch bitwise (packed BF16 experts)",
     score_same_weights(shipped, 2, ["--precision", "bf16"]))
case("shipped score --quantize int8 EP=2 fp32 dispatch bitwise (INT8 experts)",
     score_same_weights(shipped, 2, ["--precision", "bf16", "--quantize", "int8"]))


def score_split(model, n, extra):
    """The attention projections, dense MLPs, shared experts and the LM head split over the
    ranks (tensor parallel, with a row limit above the prompt's so that the prefill splits
    too): with fp32 dispatch the logits are still bit for bit those of one process."""
    def check():
        single = score(model, 1, extra)
        multi, err = score(model, n, list(extra) + ["--ep-dispatch-dtype", "fp32",
                                                    "--ep-split-rows", "64"], True)
        m = re.search(r"ep: the attention projections, dense MLPs and shared experts of (\d+) "
                      r"of (\d+) layers", err)
        assert m and int(m.group(1)) > 0, f"no layer split: {err[-1000:]}"
        assert "and the LM head" in err, f"the LM head is not split: {err[-1000:]}"
        rel, top1 = compare_logits(single, multi)
        assert rel == 0.0, f"split products at EP={n} differ from one process: max rel {rel:.3g}"
        assert top1 == 1.0
    return check


case("tiny V3 score EP=2 tensor-parallel split fp32 bitwise", score_split(tiny, 2, []))
case("tiny V2 score EP=4 tensor-parallel split fp32 bitwise",
     score_split(make_model("tiny-v2"), 4, []))
case("shipped score --precision bf16 EP=2 tensor-parallel split bitwise (packed BF16 slices)",
     score_split(shipped, 2, ["--precision", "bf16"]))
case("shipped score --precision bf16 EP=4 tensor-parallel split bitwise (packed BF16 slices)",
     score_split(shipped, 4, ["--precision", "bf16"]))


def score_network(model, n, dtype, tolerance):
    """--ep-transport network: every exchange and split product goes through MPI puts over
    TCP (staging + put + flush + flag) instead of shared-memory stores. fp32 dispatch is
    still bit for bit one process; int8 within the tolerance of the shared-memory path."""
    def check():
        single = score(model, 1, ["--precision", "bf16"])
        multi, err = score(model, n, ["--precision", "bf16", "--ep-dispatch-dtype", dtype,
                                      "--ep-split-rows", "64", "--ep-transport", "network"],
                           True, MPI_TCP)
        assert "exchange tokens through MPI one-sided puts" in err, err[-1000:]
        rel, top1 = compare_logits(single, multi)
        assert rel <= tolerance, f"{dtype} over TCP at EP={n}: max rel {rel:.3g} > {tolerance}"
        print(f"    {dtype} over TCP, EP={n}: max rel {rel:.3g}, top-1 {top1:.3f}")
    return check


case("shipped score EP=2 over MPI puts on TCP, fp32 dispatch + split, bitwise",
     score_network(shipped, 2, "fp32", 0.0))
case("shipped score EP=4 over MPI puts on TCP, int8 dispatch + split",
     score_network(shipped, 4, "int8", 0.03))


def score_rounded(model, dtype, tolerance):
    def check():
        single = score(model)
        multi = score(model, 2, ["--ep-dispatch-dtype", dtype])
        rel, top1 = compare_logits(single, multi)
        print(f"  {os.path.basename(model)} {dtype} dispatch: max rel {rel:.3g}, top-1 {top1:.3f}")
        assert rel < tolerance, f"max rel {rel:.3g} >= {tolerance}"
    return check


# bf16 and int8 tokens/results carry 8 and ~7 significant bits: logits move by ~1e-2.
# Measured on the shipped model: bf16 4.8e-4, int8 1.2e-3 (max over the logit matrix,
# relative to its largest value); the bounds leave 10x for other machines' ISA paths.
case("shipped score EP=2 bf16 within 5e-3", score_rounded(shipped, "bf16", 5e-3))
case("shipped score EP=2 int8 within 1e-2", score_rounded(shipped, "int8", 1e-2))


def bad(args, n, expect):
    def check():
        rc, out, err, took = (mpirun(n, args) if n > 1 else run([BIN] + args))
        assert rc != 0, f"exit 0 for a bad invocation: {err[-500:]}"
        assert expect in err, f"{expect!r} not in: {err[-1500:]}"
        assert took < 60, f"took {took:.0f} s"
    return check


base = ["generate", "--model", tiny, "--prompt-ids", "1,2,3", "--max-tokens", "2"]
case("--ep 3 does not divide 8 experts", bad(base + ["--ep", "3"], 3, "--ep"))
case("--ep 2 under mpirun -np 4", bad(base + ["--ep", "2"], 4, "mpirun started 4"))
case("--ep 2 without mpirun", bad(base + ["--ep", "2"], 1, "not started by mpirun"))
case("mpirun -np 2 without --ep", bad(base, 2, "pass --ep 2"))
case("copies without rebalances",
     bad(base + ["--ep", "1", "--eplb-redundant-experts", "8"], 1, "add --eplb-interval STEPS"))
case("rebalances without expert parallelism",
     bad(base + ["--ep", "1", "--eplb-interval", "8"], 1, "needs --ep N with N > 1"))
case("EP flags without --ep", bad(base + ["--eplb-interval", "8"], 1, "requires --ep"))
case("copies not a multiple of --ep",
     bad(base + ["--ep", "2", "--eplb-interval", "8", "--eplb-redundant-experts", "1"], 2,
         "must be a multiple of --ep 2"))



def drafts_of(err):
    """(accepted, proposed) from generate's statistics line."""
    m = re.search(r"MTP drafts accepted (\d+) of (\d+)", err)
    assert m, f"no MTP statistics: {err[-1500:]}"
    return int(m.group(1)), int(m.group(2))


def speculative_greedy(model, n, k, dtype, reference_n):
    """generate --ep n --speculative mtp gives the tokens of decoding without drafts: of one
    process (fp32 dispatch: its bits), or of the same EP job without drafts (int8 or bf16
    dispatch round what the experts see, alike with and without drafts). The MTP layer's
    MoE exchanges run on every rank K times a step, the idle ranks' too."""
    def check():
        precision = ["--precision", "fp32", "--ep-dispatch-dtype", dtype]
        plain = generate(model, reference_n, precision if reference_n > 1 else precision[:2],
                         max_tokens=24)
        drafted, err = generate(model, n, precision + ["--speculative", "mtp",
                                                       "--num-speculative-tokens", str(k)],
                                max_tokens=24, with_stderr=True)
        assert drafted == plain, f"drafting {drafted!r} != {plain!r}"
        accepted, proposed = drafts_of(err)
        assert proposed > 0, err[-1500:]
        if model == shipped:  # the trained head accepts most drafts; tiny's random one few
            assert accepted > 0, err[-1500:]
    return check


case("shipped greedy EP=2 --speculative mtp K=1 fp32 dispatch equals one process",
     speculative_greedy(shipped, 2, 1, "fp32", 1))
case("shipped greedy EP=2 --speculative mtp K=2 int8 dispatch equals EP=2 without drafts",
     speculative_greedy(shipped, 2, 2, "int8", 2))
case("tiny greedy EP=4 --speculative mtp K=2 fp32 dispatch (three ranks idle)",
     speculative_greedy(tiny, 4, 2, "fp32", 1))


def speculative_auto_off_under_ep():
    out, err = generate(shipped, 2, ["--speculative", "auto"], with_stderr=True)
    assert "speculative auto: off under --ep" in err, err[-1500:]
    assert out == generate(shipped, 2), "auto under --ep changed the tokens"


case("generate --ep 2 --speculative auto: off, said", speculative_auto_off_under_ep)


def rank_pids(p):
    """{rank: pid} of the peerserve processes mpirun `p` started."""
    pids = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "peerserve"], capture_output=True,
                          text=True).stdout.split()
    ranks = {}
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
        for r in range(8):
            if f"OMPI_COMM_WORLD_RANK={r}\0".encode() in env:
                ranks[r] = int(pid)
    return ranks


def lost_rank(sig, expect, network=False):
    """Rank 1 gets `sig` mid-run; the job must end non-zero, naming rank 1, within 60 s."""
    def check():
        args = ["mpirun", "-np", "2", "--oversubscribe"] + (MPI_TCP if network else []) + [
                BIN, "generate", "--model", shipped,
                "--prompt-ids", PROMPT, "--max-tokens", "100000", "--ignore-eos", "--ep", "2",
                "--ep-timeout-ms", "3000", "--threads", "1"]
        args += ["--ep-transport", "network"] if network else []
        p = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        ranks = {}
        try:
            deadline = time.monotonic() + 30
            while len(ranks) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
                ranks = rank_pids(p)
            assert len(ranks) == 2, f"expected 2 ranks, found {ranks}"
            # Mid-run means decoding: wait for the first generated text (on a loaded machine
            # the ranks can still be loading seconds after they start).
            decoding = select.select([p.stdout], [], [], 60)[0]
            assert decoding, "no generated text within 60 s"
            os.read(p.stdout.fileno(), 1)
            time.sleep(0.5)
            os.kill(ranks[1], sig)
            _, err = p.communicate(timeout=60)
        finally:
            for pid in ranks.values():  # a stopped rank outlives nothing
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if p.poll() is None:
                p.kill()
        assert p.returncode != 0, "exit 0 after losing a rank"
        assert expect in err, f"{expect!r} not in: {err[-1500:]}"
    return check


# Killed: mpirun sees the exit and ends the job, naming the rank. Stopped (a hung or
# unreachable peer mpirun cannot see): rank 0's own timeout names it.
case("rank killed mid-run: the job ends naming it", lost_rank(signal.SIGKILL, "rank 1"))
case("rank hung mid-run: rank 0 times out naming it",
     lost_rank(signal.SIGSTOP, "rank 1 did not deliver"))
# Over TCP a put or flush to the stopped rank blocks inside MPI: the call watchdog ends it.
case("rank hung mid-run over MPI puts on TCP: rank 0 names it",
     lost_rank(signal.SIGSTOP, "rank 1 did not", network=True))


def symlinked_copy(name, leave_out=()):
    """A rank's own --model (told apart on its command line): links to the shipped model."""
    return linked_model_copy(shipped, os.path.join(SCRATCH, f"{name}-{os.getpid()}"), leave_out)


def slow_loading_rank():
    """Rank 1's first open of a shard is held 3 s (strace's fault injection: it reads its
    checkpoint slowly), over an exchange timeout of 1 s. Rank 0 has loaded and waits at the
    ranks' load barrier, under --ep-load-timeout-ms: rank 1 is not taken for lost, and the
    tokens are right. (The test used to hold rank 1 on a FIFO config.json, which the loader
    now refuses.)"""
    import shutil
    slow = symlinked_copy("slow-rank")
    shard = sorted(n for n in os.listdir(slow) if n.endswith(".safetensors"))[0]
    single = generate(shipped, 1, ["--precision", "fp32"])
    common = ["generate", "--prompt-ids", PROMPT, "--max-tokens", "12", "--ignore-eos",
              "--threads", "1", "--precision", "fp32", "--ep-dispatch-dtype", "fp32", "--ep", "2",
              "--ep-timeout-ms", "1000"]
    hold = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=openat", "-e",
            "inject=openat:delay_enter=3000000:when=1", "-P", os.path.join(slow, shard)]
    try:
        rc, out, err, took = run(["mpirun", "-np", "1", "--oversubscribe", BIN] + common +
                                 ["--model", shipped, ":", "-np", "1", "--oversubscribe"] +
                                 hold + [BIN] + common + ["--model", slow], timeout=120)
    finally:
        shutil.rmtree(slow, ignore_errors=True)
    assert rc == 0, f"exit {rc} after {took:.1f} s: {err[-1500:]}"
    assert took >= 3, f"rank 1 was not held back ({took:.1f} s)"
    assert out.strip() == single, f"single {single!r} != ep2 {out.strip()!r}"


case("a rank held 3 s while it loads, past --ep-timeout-ms: not lost", slow_loading_rank)


def rank_without_its_checkpoint():
    """Rank 1's own copy of the checkpoint is unreadable (a FIFO for config.json): it says
    why, and every rank ends within seconds (rank 0 waited for its load until
    --ep-load-timeout-ms, half an hour by default)."""
    import shutil
    broken = symlinked_copy("broken-rank", leave_out=("config.json",))
    os.mkfifo(os.path.join(broken, "config.json"))
    common = ["generate", "--prompt-ids", PROMPT, "--max-tokens", "4", "--threads", "1",
              "--ep", "2"]
    try:
        rc, _, err, took = run(["mpirun", "-np", "1", "--oversubscribe", BIN] + common +
                               ["--model", shipped, ":", "-np", "1", "--oversubscribe", BIN] +
                               common + ["--model", broken], timeout=90)
    except subprocess.TimeoutExpired:
        raise AssertionError("still running after 90 s (rank 0 waits for rank 1's load)")
    finally:
        shutil.rmtree(broken, ignore_errors=True)
    assert rc != 0, f"exit 0: {err[-800:]}"
    assert took < 60, f"took {took:.1f} s"
    assert "rank 1 of 2: " in err and "a FIFO, expected a regular file" in err, err[-800:]
    assert "1 of 2 ranks could not plan their experts" in err, err[-800:]


case("a rank that cannot read its checkpoint: every rank ends at once, naming it",
     rank_without_its_checkpoint)


def slow_leader_after_the_last_step():
    """Rank 0 writes 1500 x 4096 logits (~120 MB of JSON, over a second) after the last step;
    rank 1 waits for it at teardown longer than --ep-timeout-ms. It was taken for lost there,
    skipped MPI_Finalize, and mpirun killed the job (exit 1, the file cut short)."""
    ids = ",".join(str(i % 500 + 3) for i in range(1500))
    path = os.path.join(SCRATCH, f"score-slow-leader-{os.getpid()}.json")
    rc, _, err, _ = mpirun(2, ["score", "--model", shipped, "--prompt-ids", ids, "--out", path,
                               "--threads", "1", "--ep", "2", "--ep-timeout-ms", "300"])
    assert rc == 0, f"exit {rc}: {err[-1500:]}"
    assert "wrote 1500 x" in err, err[-600:]
    with open(path) as f:
        assert len(json.load(f)["logits"]) == 1500
    os.remove(path)


case("rank 0 slow after the last step, past --ep-timeout-ms: the job still ends well",
     slow_leader_after_the_last_step)


def completions(port, body, timeout=60):
    """POSTs `body` to /v1/completions; the answer's choices."""
    import urllib.request
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)["choices"]


def complete(port, prompt, max_tokens, timeout=60, **extra):
    return completions(port, {"model": "peerserve-dsv3-tiny", "prompt": prompt,
                              "max_tokens": max_tokens, "temperature": 0, **extra},
                       timeout)[0]["text"]


def wait_ready(port, p, seconds=60):
    deadline = time.monotonic() + seconds
    while True:
        try:
            complete(port, "a", 1)
            return
        except OSError:
            assert p.poll() is None, f"serve exited early: {p.stderr.read()[-1500:]}"
            assert time.monotonic() < deadline, "rank 0 never answered"
            time.sleep(0.5)


def metric(port, name):
    """{labels: value} of one metric family at rank 0's /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            values[labels] = float(value)
    return values


def run_concurrently(fn, items):
    """fn(item) for every item, each on its own thread; returns when all are done."""
    import threading
    threads = [threading.Thread(target=fn, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def requests_per_rank(port):
    """{rank: requests rank 0 handed it}, from rank 0's /metrics."""
    routed = metric(port, "peerserve:dp_rank_requests_total")
    return {r: sum(v for k, v in routed.items() if f'rank="{r}"' in k) for r in (0, 1)}


def start_serve_ep2(extra):
    """mpirun -np 2 serve --ep 2 on the shipped model, fp32 throughout; (port, process)."""
    port = free_port()
    args = ["mpirun", "-np", "2", "--oversubscribe", BIN, "serve", "--model", shipped, "--port",
            str(port), "--ep", "2", "--ep-dispatch-dtype", "fp32", "--fp32", "--threads", "1",
            "--kv-cache-memory", "64MiB"] + list(extra)
    return port, subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)


# Concurrent greedy requests: one prefills a long prompt while the others decode. (At a near
# tie the greedy token can differ between generate, whose KV cache is BF16, and serve --fp32,
# whose cache is fp32, in one process already: "The file system" continues " single" in one
# and " simple" in the other. These prompts have no such tie.)
SERVE_JOBS = [("The kernel", 24), ("The kernel documentation describes " * 30, 8),
              ("Debian is", 16), ("To configure the network interface,", 16)]


def answers_equal_single_process(port):
    """Sends SERVE_JOBS at once; each answer must be the single process's greedy text."""
    answers = {}

    def run_job(key):
        answers[key] = complete(port, *key)
    run_concurrently(run_job, SERVE_JOBS)
    for (prompt, n), text in answers.items():
        rc, single, err, _ = run([BIN, "generate", "--model", shipped, "--prompt", prompt,
                                  "--max-tokens", str(n), "--precision", "fp32",
                                  "--threads", "1"])
        assert rc == 0, err
        assert text == single.rstrip("\n"), f"{text!r} != single {single!r}"


def serve_ep2():
    """serve --ep 2: rank 0 answers the API and hands requests to both ranks (least loaded);
    concurrent requests (one prefilling a long prompt while others decode) give the single
    process's tokens; only rank 0 listens; an idle pause longer than the peer timeout does
    not break the lock-step; SIGTERM to every rank ends them all with exit 0."""
    port, p = start_serve_ep2(["--microbatches", "2", "--ep-timeout-ms", "2000"])
    try:
        wait_ready(port, p)
        answers_equal_single_process(port)
        per_rank = requests_per_rank(port)
        assert per_rank[0] >= 2 and per_rank[1] >= 2, f"requests per rank: {per_rank}"
        running = metric(port, "peerserve:dp_rank_running_sequences")
        assert all(v == 0 for v in running.values()), f"still running: {running}"
        with __import__("socket").socket() as s:  # rank 1 has no HTTP server
            assert s.connect_ex(("127.0.0.1", port + 1)) != 0, "something listens on port + 1"
        time.sleep(3)  # idle longer than --ep-timeout-ms: the ranks keep agreeing meanwhile
        assert complete(port, "The kernel", 4), "no answer after an idle pause"
        assert complete(port, "The kernel", 4), "no answer after an idle pause"
        # Prompt logprobs travel from either rank (the codec carries them): one request of four
        # equal prompts, which rank 0 spreads over both ranks as it submits them, gives four
        # equal answers (fp32 dispatch: one process's bits on any rank).
        before = requests_per_rank(port)
        prompt = "The kernel documentation describes the subsystems"
        scored = [c["logprobs"] for c in completions(
            port, {"prompt": [prompt] * 4, "max_tokens": 0, "echo": True, "logprobs": 2})]
        after = requests_per_rank(port)
        assert all(after[r] > before[r] for r in (0, 1)), f"requests per rank: {before} {after}"
        first = scored[0]
        assert first["token_logprobs"][0] is None and len(first["tokens"]) > 3, first
        assert all(isinstance(v, float) for v in first["token_logprobs"][1:]), first
        assert len(scored) == 4 and all(s == first for s in scored), "they differ between ranks"
        # Structured outputs travel as their pattern, compiled on the rank that runs them: four
        # equal greedy prompts spread over both ranks give four equal full matches.
        before = requests_per_rank(port)
        pattern = "20[0-9]{2}-(?:0[1-9]|1[0-2])-[0-3][0-9]"
        dates = [c["text"] for c in completions(
            port, {"prompt": ["The date was"] * 4, "max_tokens": 24, "temperature": 0,
                   "guided_regex": pattern})]
        after = requests_per_rank(port)
        assert all(after[r] > before[r] for r in (0, 1)), f"requests per rank: {before} {after}"
        assert all(re.fullmatch(pattern, d) for d in dates), dates
        assert all(d == dates[0] for d in dates), f"they differ between ranks: {dates}"
        # /metrics counts the group: the engines' finished requests (rank 1's arrive with its
        # outputs) add up to the requests the router handed out, none is left running, and
        # the expert counters cover every rank's tokens. (They counted rank 0's engine only,
        # and under --ep had no expert counters at all.)
        routed = sum(requests_per_rank(port).values())
        finished = sum(metric(port, "vllm:request_success_total").values())
        assert finished == routed, f"finished {finished} of {routed} routed requests"
        assert sum(metric(port, "vllm:num_requests_running").values()) == 0
        experts = metric(port, "peerserve:moe_expert_tokens_total")
        per_layer = {}
        for labels, value in experts.items():
            layer = re.search(r'layer="(\d+)"', labels).group(1)
            per_layer[layer] = per_layer.get(layer, 0) + value
        # Layers 1 and 2 route every forwarded token; the last one skips the prompt rows
        # whose hidden states nothing reads (skip_unreturned_rows), so it routes fewer.
        assert sorted(per_layer) == ["1", "2", "3"], per_layer
        assert per_layer["1"] == per_layer["2"] >= per_layer["3"] > 0, per_layer
        assert all(v % 4 == 0 for v in per_layer.values()), per_layer  # top 4 per token
        tokens = sum(metric(port, "vllm:prompt_tokens_total").values()) + \
            sum(metric(port, "vllm:generation_tokens_total").values())
        # Every forwarded token routes 4 experts per layer; prefix-cache hits and each
        # request's last token are not forwarded, so at most that many.
        assert per_layer["1"] <= 4 * tokens, (per_layer, tokens)
        # SIGTERM to every rank at once (what systemd sends to a unit's processes; mpirun
        # itself turns a signal into a non-zero exit): the followers keep serving, rank 0
        # drains and stops the group, every rank exits 0. (A follower used to end at once.)
        ranks = rank_pids(p)
        assert sorted(ranks) == [0, 1], f"rank pids: {ranks}"
        for rank in sorted(ranks, reverse=True):
            os.kill(ranks[rank], signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, f"exit {p.returncode}: {err[-1500:]}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


case("serve --ep 2: rank 0 spreads requests over both ranks, same tokens", serve_ep2)


def serve_ep2_speculative(microbatches):
    """serve --ep 2 --speculative mtp: both ranks draft for their own requests, and each
    step's MTP passes are joined by the other rank (idle or not); concurrent greedy requests
    give the single process's tokens, the draft counters of /metrics count both ranks'
    drafts, and SIGTERM ends the group with exit 0. With two microbatches the pipeline runs
    each step's main forward, the MTP passes after it."""
    port, p = start_serve_ep2(["--speculative", "mtp", "--num-speculative-tokens", "2",
                               "--ep-timeout-ms", "5000", "--microbatches", str(microbatches)])
    try:
        wait_ready(port, p)
        answers_equal_single_process(port)
        per_rank = requests_per_rank(port)
        assert per_rank[0] >= 1 and per_rank[1] >= 1, f"requests per rank: {per_rank}"
        proposed = sum(metric(port, "vllm:spec_decode_num_draft_tokens_total").values())
        accepted = sum(metric(port, "vllm:spec_decode_num_accepted_tokens_total").values())
        assert proposed > 0 and 0 < accepted <= proposed, (accepted, proposed)
        ranks = rank_pids(p)
        for rank in sorted(ranks, reverse=True):
            os.kill(ranks[rank], signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 0, f"exit {p.returncode}: {err[-1500:]}"
        assert "the MTP layer (INT8) drafts 2 tokens per step" in err, err[-1500:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


for mb in (1, 2):
    case(f"serve --ep 2 --speculative mtp --microbatches {mb}: both ranks draft, same tokens",
         lambda mb=mb: serve_ep2_speculative(mb))


def serve_lost_rank():
    """serve --ep 2 with rank 1 killed mid-generation: the streaming client gets an end (not
    a hang) and the job exits non-zero naming the lost rank, within the peer timeout. (With
    a pool: int8 dispatch computes other KV than one process, so its namespace says so.)"""
    import threading
    import urllib.request
    port = free_port()
    args = ["mpirun", "-np", "2", "--oversubscribe", BIN, "serve", "--model", shipped, "--port",
            str(port), "--ep", "2", "--threads", "1", "--kv-cache-memory", "64MiB",
            "--ep-timeout-ms", "3000", "--kv-pool", "local"]
    p = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    ranks = {}
    try:
        wait_ready(port, p)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            identity = json.load(r)["data"][0]["peerserve"]["kv_namespace"]
        assert "+ep-int8" in identity, identity
        ranks = rank_pids(p)
        assert len(ranks) == 2, f"expected 2 ranks, found {ranks}"
        results = []

        def long_job():
            try:
                results.append(complete(port, "The kernel", 1000, timeout=60, ignore_eos=True))
            except Exception as e:  # noqa: BLE001 - any end is fine, a hang is not
                results.append(e)
        threads = [threading.Thread(target=long_job) for _ in range(2)]  # one per rank
        for t in threads:
            t.start()
        time.sleep(2)
        os.kill(ranks[1], signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a client hung after the rank was lost"
        _, err = p.communicate(timeout=60)
        assert p.returncode != 0, "exit 0 after losing a rank"
        assert "rank 1" in err, f"'rank 1' not in: {err[-1500:]}"
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            p.kill()
            p.wait()


case("serve --ep 2: a rank killed mid-run ends the job naming it, clients not hung",
     serve_lost_rank)


def decode_ep2_over_two_prefill_instances():
    """serve --role decode --ep 2 --prefill A,B: each DP rank sends its prompts to the
    prefill instance the §4.3.3 mapping gives it (rank 0 -> A, rank 1 -> B), so both
    prefill instances work; the tokens are the single process's."""
    import threading
    procs = []

    def start(args, marker, stream="stderr"):
        q = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        procs.append(q)
        deadline = time.monotonic() + 60
        source = q.stdout if stream == "stdout" else q.stderr
        for line in source:
            if marker in line:
                for pipe in (q.stdout, q.stderr):  # keep draining: a full pipe would block it
                    threading.Thread(target=pipe.read, daemon=True).start()
                return q
            assert time.monotonic() < deadline, f"{args[1]} not ready"
        raise AssertionError(f"{args[:3]} exited before '{marker}'")
    try:
        pool_port = free_port()
        start([BIN, "cache-server", "--listen", f"127.0.0.1:{pool_port}", "--dram", "256MiB"],
              "listening on", "stdout")
        pool = ["--kv-pool", f"127.0.0.1:{pool_port}"]
        prefill_ports = [free_port(), free_port()]
        for pp in prefill_ports:
            start([BIN, "serve", "--model", shipped, "--port", str(pp), "--threads", "1",
                   "--kv-cache-memory", "64MiB", "--role", "prefill", "--fp32"] + pool,
                  "serving model")
        port = free_port()
        args = ["mpirun", "-np", "2", "--oversubscribe", BIN, "serve", "--model", shipped,
                "--port", str(port), "--ep", "2", "--threads", "1", "--kv-cache-memory",
                "64MiB", "--role", "decode", "--prefill",
                ",".join(f"127.0.0.1:{pp}" for pp in prefill_ports),
                "--ep-dispatch-dtype", "fp32", "--fp32"] + pool
        p = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        procs.append(p)
        wait_ready(port, p)
        filler = " the scheduler balances load across the processors of the machine" * 4
        prompts = [f"{i}. Debian{filler}" for i in range(6)]
        texts = {}

        def run_job(prompt):
            texts[prompt] = complete(port, prompt, 6)
        run_concurrently(run_job, prompts)
        per_rank = requests_per_rank(port)
        assert per_rank[0] >= 1 and per_rank[1] >= 1, f"requests per rank: {per_rank}"
        for pp in prefill_ports:
            prefilled = sum(metric(pp, "peerserve:prompt_tokens_total").values())
            assert prefilled > 0, f"prefill instance {pp} computed no prompt: {per_rank}"
        for prompt in prompts[:2]:
            rc, single, err, _ = run([BIN, "generate", "--model", shipped, "--prompt", prompt,
                                      "--max-tokens", "6", "--precision", "fp32", "--threads",
                                      "1"])
            assert rc == 0, err
            assert texts[prompt] == single.rstrip("\n"), f"{texts[prompt]!r} != {single!r}"
        ranks = rank_pids(p)
        os.kill(ranks[0], signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert "prompts go first to prefill instance 0 of 2" in err and \
            "prompts go first to prefill instance 1 of 2" in err, err[-1500:]
    finally:
        stop_all(procs)


case("serve --role decode --ep 2: each rank prefills on its own instance (§4.3.3)",
     decode_ep2_over_two_prefill_instances)


print(f"{len(failures) == 0 and 'all' or len(failures)} " +
      ("cases passed" if not failures else f"failed: {failures}"))
sys.exit(1 if failures else 0)
