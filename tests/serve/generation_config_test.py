"""The checkpoint's generation_config.json as `serve` reads it (serve/generation_defaults.h),
through real servers on the shipped model (without its tokenizer, so prompts and outputs are
token ids):
- a request that leaves temperature out gets the file's (0 here: greedy, repeatable);
- the file's eos_token_id ids end generation besides config.json's;
- `--generation-config vllm` ignores the file.

usage: generation_config_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import shutil
import sys
import tempfile
import urllib.request

from serve_harness import case, exit_code, free_port, launch, stop_all

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")
PROMPT = [5, 17, 300, 42, 7, 99]


def model_dir(generation_config):
    """The shipped model's weights and config, this generation_config.json, no tokenizer."""
    d = tempfile.mkdtemp(prefix="generation_config_test_")
    for name in os.listdir(MODEL):
        if name.endswith(".safetensors") or name in ("config.json", "model.safetensors.index.json"):
            os.symlink(os.path.join(MODEL, name), os.path.join(d, name))
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(generation_config, f)
    return d


def serve(directory, *flags):
    port = free_port()
    p, log = launch([BIN, "serve", "--model", directory, "--port", str(port), "--threads", "1",
                     "--kv-cache-memory", "64MiB", *flags])
    return p, port, log


def complete(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 json.dumps({"prompt": PROMPT, "logprobs": 0, **body}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        choice = json.load(r)["choices"][0]
    ids = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
    return ids, choice["finish_reason"]


dirs, procs = [], []
try:
    # The greedy continuation, with explicit greedy sampling and the file ignored.
    dirs.append(model_dir({"temperature": 0.0}))
    p, vllm_port, _ = serve(dirs[-1], "--generation-config", "vllm")
    procs.append(p)
    greedy, _ = complete(vllm_port, {"temperature": 0, "max_tokens": 8, "ignore_eos": True})
    assert len(greedy) == 8, greedy

    p, auto_port, log = serve(dirs[-1])
    procs.append(p)

    def file_temperature_is_the_default():
        assert any("temperature=0" in line for line in log), "".join(log)
        for _ in range(2):
            ids, _ = complete(auto_port, {"max_tokens": 8, "ignore_eos": True})
            assert ids == greedy, (ids, greedy)

    def vllm_mode_ignores_the_file():
        # Temperature 1 without a seed: two answers that both equal greedy would be chance.
        answers = [complete(vllm_port, {"max_tokens": 8, "ignore_eos": True})[0] for _ in range(3)]
        assert any(a != greedy for a in answers), answers

    case("a request without temperature gets the file's", file_temperature_is_the_default)
    case("--generation-config vllm ignores the file", vllm_mode_ignores_the_file)

    # The file's EOS id: the first greedy token after the first that is new ends generation.
    at = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])
    eos = greedy[at]
    dirs.append(model_dir({"eos_token_id": [1, eos]}))
    p, eos_port, _ = serve(dirs[-1])
    procs.append(p)

    def file_eos_ends_generation():
        ids, finish = complete(eos_port, {"temperature": 0, "max_tokens": 8})
        assert ids == greedy[:at + 1] and finish == "stop", (ids, finish)
        ids, finish = complete(eos_port, {"temperature": 0, "max_tokens": 8, "ignore_eos": True})
        assert ids == greedy and finish == "length", (ids, finish)

    case("generation_config.json's eos_token_id ends generation", file_eos_ends_generation)
finally:
    stop_all(procs)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
sys.exit(exit_code())
