#!/usr/bin/python3
"""Checks a model folder's tokenizer against independent references.

  /usr/bin/python3 check_tokenizer.py MODEL_DIR [--data DATA_DIR [--split train]] [--max-docs N]

- tokenizer.json has DeepSeek-V3's normalizer, pre-tokenizer, post-processor and decoder
  (compared with the DeepSeek-V3 tokenizer.json of tests/js/node_modules, when installed);
- @lenml/tokenizers (transformers.js) loading the same files produces the same
  pre-tokenizer pieces and token ids as this package's Python encoder, and decodes them to
  the same text as the Python decoder, on fixed edge-case strings and (with --data) the documents of a split;
- the chat template renders the same in jinja2 (python3-jinja2), in transformers.js and in
  bpe_tokenizer.render_chat().
Exit status: 0 pass, 1 mismatch, 77 when node or the npm packages are missing.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bpe_tokenizer  # noqa: E402
import pretokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
V3_TOKENIZER = os.path.join(REPO, "tests", "js", "node_modules", "@lenml",
                            "tokenizer-deepseek_v3", "models", "tokenizer.json")
LENML = os.path.join(REPO, "tests", "js", "node_modules", "@lenml", "tokenizers")

EDGE_CASES = [
    "Hello world!  It's 12345 apples,\n\n  and (foo) bar...\r\n x.y=3;  \tz",
    "The kernel's  page-cache\n\n\n   uses 4096-byte pages; see Documentation/mm.\n",
    "naïve café — “quotes” 日本語テキスト 中文 123４５６ émoji 😀 \u00a0nbsp\u2003em",
    "    indented code();\n\t\tif (x->y[0] == '\\0') { return -EINVAL; }\n",
    "=====\nTitle\n=====\n\n.. note::\n\n   ``literal`` and `link <http://x.org/>`_\n",
    "trailing spaces   \n\n\n",
    "mixed\u0301 marks and \u200bzero\u200bwidth and \x07bell",
    "<｜User｜>hi<｜Assistant｜>there<｜end▁of▁sentence｜>",
    "",
    " ",
    "a",
]
CHATS = [
    [{"role": "user", "content": "What is a kernel module?"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "What is RCU?"}],
]


def check_structure(tok_json, failures):
    if not os.path.exists(V3_TOKENIZER):
        print(f"note: {V3_TOKENIZER} missing; structure not compared")
        return
    with open(V3_TOKENIZER, encoding="utf-8") as f:
        v3 = json.load(f)
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if tok_json[key] != v3[key]:
            failures.append(f"tokenizer.json {key} differs from DeepSeek-V3's")
    v3_model = {k: v for k, v in v3["model"].items() if k not in ("vocab", "merges")}
    ours = {k: v for k, v in tok_json["model"].items() if k not in ("vocab", "merges")}
    if v3_model != ours:
        failures.append(f"model settings differ: {ours} vs {v3_model}")
    v3_added = {t["content"]: {k: v for k, v in t.items() if k != "id"}
                for t in v3["added_tokens"] if "place▁holder" not in t["content"]}
    our_added = {t["content"]: {k: v for k, v in t.items() if k != "id"}
                 for t in tok_json["added_tokens"]}
    if v3_added != our_added:
        failures.append("added_tokens differ from DeepSeek-V3's (names or flags)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--data", help="prepared data folder: also check held-out documents")
    parser.add_argument("--split", choices=["heldout", "train"], default="heldout")
    parser.add_argument("--max-docs", type=int, default=0)
    args = parser.parse_args()
    failures = []
    with open(os.path.join(args.model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok_json = json.load(f)
    check_structure(tok_json, failures)
    tok = bpe_tokenizer.load(os.path.join(args.model_dir, "tokenizer.json"))

    texts = list(EDGE_CASES)
    if args.data:
        import corpus
        docs = corpus.read_documents(args.data, args.split)
        texts += docs[:args.max_docs] if args.max_docs else docs

    try:
        import jinja2
        env = jinja2.Environment()
        for chat in CHATS:
            rendered = env.from_string(bpe_tokenizer.CHAT_TEMPLATE).render(
                messages=chat, add_generation_prompt=True, bos_token=bpe_tokenizer.BOS)
            if rendered != bpe_tokenizer.render_chat(chat):
                failures.append(f"jinja2 renders {rendered!r}, render_chat "
                                f"{bpe_tokenizer.render_chat(chat)!r}")
    except ImportError:
        print("note: python3-jinja2 missing; chat template not rendered with jinja2")

    if not (os.path.isdir(LENML) and subprocess.run(["node", "--version"],
                                                    capture_output=True).returncode == 0):
        print("SKIP: node or tests/js/node_modules missing (run scripts/install-test-js.sh)")
        sys.exit(77 if not failures else 1)
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w", encoding="utf-8") as f:
            json.dump({"texts": texts, "chats": CHATS}, f, ensure_ascii=False)
        subprocess.run(["node", os.path.join(HERE, "js_tokenizer_reference.js"),
                        args.model_dir, inp, out], check=True)
        with open(out, encoding="utf-8") as f:
            js = json.load(f)
    specials = set(bpe_tokenizer.CHAT_SPECIALS) | {bpe_tokenizer.BOS, bpe_tokenizer.EOS}
    token_count = 0
    for text, ref in zip(texts, js["texts"]):
        ids = tok.encode(text, add_bos=False)
        token_count += len(ids)
        if not any(s in text for s in specials):
            pieces = [bpe_tokenizer.to_byte_chars(p) for p in pretokenizer.pre_tokenize(text)]
            if pieces != ref["pieces"]:
                failures.append(f"pre-tokenizer pieces differ on {text[:60]!r}")
        if ids != ref["ids"]:
            failures.append(f"ids differ on {text[:60]!r}: {ids[:20]} vs {ref['ids'][:20]}")
        if tok.decode(ids) != ref["decoded"]:
            failures.append(f"decode differs on {text[:60]!r}")
    for chat, ref in zip(CHATS, js["chats"]):
        mine = bpe_tokenizer.render_chat(chat)
        if ref["rendered"] != mine:
            failures.append(f"transformers.js renders {ref['rendered']!r}, render_chat {mine!r}")
        if tok.encode(mine, add_bos=False) != ref["ids"]:
            failures.append(f"chat ids differ: {tok.encode(mine, add_bos=False)} vs {ref['ids']}")
    for f_ in failures[:20]:
        print("FAIL:", f_)
    print(f"{'OK' if not failures else 'FAIL'}: {len(texts)} texts, {token_count} tokens, "
          f"{len(CHATS)} chats compared with transformers.js")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
