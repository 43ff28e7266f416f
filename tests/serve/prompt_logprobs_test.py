"""Prompt logprobs in `peerserve serve` (OpenAI's echo, vLLM's prompt_logprobs), as real
processes on loopback, against the shipped model's reference logits (PyTorch, float32:
models/peerserve-dsv3-tiny/reference/logits.safetensors, independent of the engine).

Cases (all run; exit 1 if any failed):
- `echo` with `logprobs` and `max_tokens` 0 (how evaluation harnesses score a text) on the
  exact (--fp32) path: each prompt token's logprob, its top-5 and vLLM's rank equal the
  reference's log-softmax; the echoed text is the prompt's; no completion token is counted.
  The 64-token prompt is computed in chunks of 16;
- a prompt whose blocks are in the prefix cache gets the same logprobs (computed again, 0
  cached tokens);
- asking for prompt logprobs changes no generated token; n = 2 echoes the prompt in both
  choices; a streamed echo sends the same text (and with return_token_ids the same ids, the
  prompt's in the first chunk);
- return_tokens_as_token_ids (vLLM's): the same logprobs with every token named "token_id:N"
  after the ids return_token_ids gives (chat: the bytes are that name's);
- with `--speculative mtp` the prompt logprobs and the greedy answer equal those without;
- bad input (prompt_logprobs with stream, max_tokens 0 without echo, echo in chat, 21
  alternatives) gets a 400 naming the field.
Usage: prompt_logprobs_test.py PEERSERVE_BINARY SOURCE_DIR
"""
import json
import os
import struct
import sys

import numpy as np

from serve_harness import ServeProcess, case, exit_code

BIN, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "peerserve-dsv3-tiny")
BOS = "<｜begin▁of▁sentence｜>"
# fp32 GEMMs: tests/reference_model holds the logits to 1e-4 of the row scale; a logprob adds
# the log-sum-exp's error to its logit's.
TOLERANCE = 2e-3


def load_reference():
    with open(os.path.join(MODEL, "reference", "logits.safetensors"), "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__")

    def tensor(name):
        entry = header[name]
        begin, end = entry["data_offsets"]
        dtype = {"F32": np.float32, "I32": np.int32}[entry["dtype"]]
        return np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"])

    prompts = []
    for p in range(int(meta["prompt_count"])):
        prompts.append({"ids": [int(t) for t in tensor(f"prompts.{p}.input_ids")],
                        "logits": tensor(f"prompts.{p}.logits").astype(np.float64),
                        "text": meta[f"prompts.{p}.text"]})
    return prompts


def start_server(*flags):
    return ServeProcess(BIN, MODEL, "--max-num-batched-tokens", "16", "--max-num-seqs", "16",
                        *flags)


def log_softmax(row):
    m = row.max()
    return row - m - np.log(np.exp(row - m).sum())


def score(server, ids, top=5):
    status, r = server.post("/v1/completions",
                            {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": top,
                             "prompt_logprobs": top, "temperature": 0})
    assert status == 200, r
    return r


def check_against_reference(r, prompt):
    ids, logits = prompt["ids"], prompt["logits"]
    choice = r["choices"][0]
    text = prompt["text"] if prompt["text"].startswith(BOS) else BOS + prompt["text"]
    assert choice["text"] == text, (choice["text"], text)
    assert choice["finish_reason"] == "length", choice["finish_reason"]
    assert r["usage"]["completion_tokens"] == 0 and r["usage"]["prompt_tokens"] == len(ids), \
        r["usage"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids), (len(lp["tokens"]), len(ids))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    vllm = choice["prompt_logprobs"]
    assert len(vllm) == len(ids) and vllm[0] is None, len(vllm)
    worst = 0.0
    for i in range(1, len(ids)):
        want = log_softmax(logits[i - 1])
        token = ids[i]
        worst = max(worst, abs(lp["token_logprobs"][i] - want[token]))
        # The token's entry, then the 5 most likely: their values against the reference's.
        top = sorted(lp["top_logprobs"][i].values(), reverse=True)
        best = np.sort(want)[::-1][:5]
        for got in top[:5]:
            assert np.min(np.abs(best - got)) < TOLERANCE or abs(got - want[token]) < TOLERANCE, \
                f"prompt token {i}: top logprob {got} not among {best}"
        entry = vllm[i][str(token)]
        assert abs(entry["logprob"] - want[token]) < TOLERANCE, (i, entry, want[token])
        # vLLM's rank: 1 + the tokens more likely; skipped where another logit is a near tie.
        row = logits[i - 1]
        near = np.abs(row - row[token]) < 1e-3
        if near.sum() == 1:
            assert entry["rank"] == 1 + int((row > row[token]).sum()), (i, entry)
    assert worst < TOLERANCE, f"worst prompt logprob error {worst}"
    return worst


def main():
    reference = load_reference()
    exact = start_server("--fp32")
    try:
        results = {}

        def against_reference():
            worst = 0.0
            for p, prompt in enumerate(reference):
                results[p] = score(exact, prompt["ids"])
                worst = max(worst, check_against_reference(results[p], prompt))
            print(f"  worst |logprob - reference| over {len(reference)} prompts: {worst:.2e}")

        def despite_the_prefix_cache():
            ids = reference[4]["ids"]
            status, _ = exact.post("/v1/completions", {"prompt": ids, "max_tokens": 1})
            assert status == 200
            status, warm = exact.post("/v1/completions", {"prompt": ids, "max_tokens": 1})
            assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, warm["usage"]
            again = score(exact, ids)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, again["usage"]
            assert again["choices"][0]["logprobs"] == results[4]["choices"][0]["logprobs"]
            assert again["choices"][0]["prompt_logprobs"] == \
                results[4]["choices"][0]["prompt_logprobs"]

        def answers_unchanged():
            for prompt in reference[:3]:
                body = {"prompt": prompt["ids"], "max_tokens": 8, "temperature": 0,
                        "ignore_eos": True, "logprobs": 0}
                _, plain = exact.post("/v1/completions", body)
                _, asked = exact.post("/v1/completions", dict(body, prompt_logprobs=2))
                _, echoed = exact.post("/v1/completions", dict(body, echo=True))
                text = plain["choices"][0]["text"]
                assert asked["choices"][0]["text"] == text, (asked, plain)
                prefix = echoed["choices"][0]["text"][:-len(text)]
                assert echoed["choices"][0]["text"].endswith(text) and prefix.endswith(
                    prompt["text"][-8:]), echoed["choices"][0]["text"]
                n = len(prompt["ids"])
                assert echoed["choices"][0]["logprobs"]["tokens"][n:] == \
                    plain["choices"][0]["logprobs"]["tokens"]

        def two_choices():
            _, r = exact.post("/v1/completions",
                              {"prompt": "The kernel", "n": 2, "max_tokens": 4, "echo": True,
                               "logprobs": 1, "temperature": 0.8, "seed": 3})
            a, b = r["choices"]
            assert a["text"].startswith("The kernel") and b["text"].startswith("The kernel")
            n = 3  # BOS, "The", " kernel"
            assert a["logprobs"]["token_logprobs"][:n] == b["logprobs"]["token_logprobs"][:n]
            assert a["logprobs"]["token_logprobs"][0] is None

        def streamed():
            body = {"prompt": "The Linux kernel is", "max_tokens": 6, "echo": True,
                    "logprobs": 1, "temperature": 0, "return_token_ids": True}
            _, whole = exact.post("/v1/completions", body)
            _, chunks = exact.post("/v1/completions", dict(body, stream=True), stream=True)
            text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
            assert text == whole["choices"][0]["text"], (text, whole["choices"][0]["text"])
            # return_token_ids: the prompt's ids in the first chunk, then each chunk's own.
            ids = [t for c in chunks if c.get("choices") for t in c["choices"][0]["token_ids"]]
            assert ids == whole["choices"][0]["token_ids"] and len(ids) == 6, ids
            assert chunks[0]["choices"][0]["prompt_token_ids"] == \
                whole["choices"][0]["prompt_token_ids"]
            assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:]
                       if c.get("choices"))
            first = chunks[0]["choices"][0]["logprobs"]
            assert first["token_logprobs"][0] is None
            n = len(first["tokens"])
            assert first["token_logprobs"] == whole["choices"][0]["logprobs"]["token_logprobs"][:n]

        def tokens_as_ids():
            # vLLM's return_tokens_as_token_ids: the same logprobs, each token named
            # "token_id:N" after the id return_token_ids reports. In chat, as in vLLM, the
            # sampled token keeps its own bytes and the top_logprobs carry their names' bytes.
            body = {"prompt": "The Linux kernel is", "max_tokens": 6, "echo": True,
                    "logprobs": 2, "temperature": 0, "return_token_ids": True}
            _, named = exact.post("/v1/completions", body)
            _, ids = exact.post("/v1/completions", dict(body, return_tokens_as_token_ids=True))
            a, b = named["choices"][0], ids["choices"][0]
            assert a["text"] == b["text"] and a["token_ids"] == b["token_ids"]
            assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"]
            all_ids = b["prompt_token_ids"] + b["token_ids"]
            assert b["logprobs"]["tokens"] == [f"token_id:{t}" for t in all_ids], b["logprobs"]
            for top in b["logprobs"]["top_logprobs"][1:]:
                assert all(k.startswith("token_id:") and k[9:].isdigit() for k in top), top
            chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                    "temperature": 0, "logprobs": True, "top_logprobs": 2,
                    "return_token_ids": True, "return_tokens_as_token_ids": True}
            _, r = exact.post("/v1/chat/completions", chat)
            _, plain = exact.post("/v1/chat/completions",
                                  dict(chat, return_tokens_as_token_ids=False))
            content = r["choices"][0]["logprobs"]["content"]
            assert [c["token"] for c in content] == \
                [f"token_id:{t}" for t in r["choices"][0]["token_ids"]], content
            assert [c["bytes"] for c in content] == \
                [c["bytes"] for c in plain["choices"][0]["logprobs"]["content"]], (content, plain)
            for c in [t for c in content for t in c["top_logprobs"]]:
                assert c["bytes"] == list(c["token"].encode()), c

        def offsets_index_the_text():
            # text_offset[i] is where token i starts in the returned text (OpenAI's meaning).
            # The BOS that tokenizing a text prompt adds is not in the echoed text: offset 0 and
            # no characters (the offsets counted its 21-character name). A prompt given as ids
            # echoes their decoded text, BOS included.
            # A text that starts with the BOS text itself (as a chat template's rendering
            # does) gets the added BOS too: only the one in the text takes characters.
            base = {"max_tokens": 4, "echo": True, "logprobs": 0, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            _, by_text = exact.post("/v1/completions", dict(base, prompt="The kernel"))
            bos = by_text["choices"][0]["logprobs"]["tokens"][0]
            for prompt in ["The kernel", by_text["choices"][0]["prompt_token_ids"],
                           bos + "The kernel"]:
                _, r = exact.post("/v1/completions", dict(base, prompt=prompt))
                c = r["choices"][0]
                text, lp = c["text"], c["logprobs"]
                offsets, tokens = lp["text_offset"], lp["tokens"]
                assert offsets == sorted(offsets) and offsets[-1] < len(text), (text, offsets)
                for i in range(1, len(tokens)):  # tokens[0] is BOS
                    assert text[offsets[i]:].startswith(tokens[i]), (i, text, tokens, offsets)
                added = prompt == "The kernel" or prompt == bos + "The kernel"
                assert offsets[1] == (0 if added else len(bos)), (prompt, text, offsets)

        def refused():
            for path, body, param in [
                    ("/v1/completions", {"prompt": "x", "stream": True, "prompt_logprobs": 1},
                     "prompt_logprobs"),
                    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
                    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
                    ("/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo")]:
                status, r = exact.post(path, body)
                assert status == 400 and r["error"]["param"] == param, (body, status, r)

        case("echo + logprobs, max_tokens 0: the reference's logprobs", against_reference)
        case("a cached prompt is computed again for its logprobs", despite_the_prefix_cache)
        case("prompt logprobs change no generated token", answers_unchanged)
        case("n = 2 echoes the prompt in both choices", two_choices)
        case("a streamed echo sends the same text and token ids", streamed)
        case("return_tokens_as_token_ids names the same tokens by id", tokens_as_ids)
        case("text_offset indexes the echoed text", offsets_index_the_text)
        case("bad input is refused by name", refused)
    finally:
        exact.stop()

    def speculative_equal():
        answers = []
        for flags in ([], ["--speculative", "mtp"]):
            server = start_server(*flags)
            try:
                got = []
                for prompt in reference:
                    r = score(server, prompt["ids"], top=2)
                    got.append(r["choices"][0]["logprobs"]["token_logprobs"])
                    _, g = server.post("/v1/completions",
                                       {"prompt": prompt["ids"], "max_tokens": 12,
                                        "temperature": 0, "ignore_eos": True,
                                        "prompt_logprobs": 1})
                    got.append((g["choices"][0]["text"], g["choices"][0]["prompt_logprobs"]))
                answers.append(got)
            finally:
                server.stop()
        assert answers[0] == answers[1], "speculative decoding changed prompt logprobs or text"

    case("--speculative mtp: the same prompt logprobs and answers", speculative_equal)
    return exit_code()


if __name__ == "__main__":
    sys.exit(main())
