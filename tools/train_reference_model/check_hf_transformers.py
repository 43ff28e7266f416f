#!/usr/bin/env python3
"""Checks a model folder with the Hugging Face libraries, where they are installed (they
are not on the Debian development machine; the GPU machines have them).

  python3 check_hf_transformers.py MODEL_DIR [--data DATA_DIR]

- `tokenizers` (the Rust implementation) loading tokenizer.json gives the same ids as
  this package's encoder on edge cases and (with --data) every held-out document;
- `transformers` loading the folder as DeepseekV3ForCausalLM (its own implementation,
  float32, eager attention; it ignores the MTP layer) gives the main-model logits of
  reference/logits.safetensors within 1e-4 of the row scale.
Exit status: 0 pass, 1 mismatch, 77 when neither library is importable.
"""

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bpe_tokenizer  # noqa: E402
import check_tokenizer  # noqa: E402


def row_relative_error(ref, got):
    scale = ref.abs().amax(-1, keepdim=True).clamp(min=1.0)
    return ((ref - got).abs() / scale).max().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--data")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    failures, ran = [], 0

    try:
        import tokenizers
    except ImportError:
        tokenizers = None
        print("note: `tokenizers` is not installed; tokenizer not checked")
    if tokenizers is not None:
        ran += 1
        hf = tokenizers.Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
        ours = bpe_tokenizer.load(os.path.join(args.model_dir, "tokenizer.json"))
        texts = list(check_tokenizer.EDGE_CASES)
        if args.data:
            import corpus
            texts += corpus.read_documents(args.data, "heldout")
        bad = 0
        for text in texts:
            if hf.encode(text, add_special_tokens=False).ids != ours.encode(text, add_bos=False):
                bad += 1
                if bad <= 5:
                    failures.append(f"tokenizers disagrees on {text[:60]!r}")
        print(f"tokenizers {tokenizers.__version__}: {len(texts) - bad}/{len(texts)} texts agree")

    try:
        import torch
        import transformers
    except ImportError:
        transformers = None
        print("note: `transformers` is not installed; logits not checked")
    if transformers is not None:
        import safetensors_file  # needs torch: imported only where torch is
        ran += 1
        kwargs = {"attn_implementation": "eager"}
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.model_dir, dtype=torch.float32, **kwargs)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                args.model_dir, torch_dtype=torch.float32, **kwargs)
        model.eval()
        fixture, meta = safetensors_file.read(
            os.path.join(args.model_dir, "reference", "logits.safetensors"))
        worst = 0.0
        for p in range(int(meta["prompt_count"])):
            ids = fixture[f"prompts.{p}.input_ids"].long().unsqueeze(0)
            with torch.no_grad():
                logits = model(ids, use_cache=False).logits[0].float()
            err = row_relative_error(fixture[f"prompts.{p}.logits"], logits)
            # A NaN error is the worst (Python's max(0.0, nan) is 0.0).
            worst = max(worst, err, key=lambda e: math.inf if math.isnan(e) else e)
            print(f"transformers {transformers.__version__}, prompt {p} ({ids.shape[1]} tokens): "
                  f"max row-relative error {err:.2e}")
        if not worst <= args.tolerance:  # NaN included
            failures.append(f"transformers logits differ by {worst:.2e} (> {args.tolerance})")
    for f in failures:
        print("FAIL:", f)
    if not ran:
        sys.exit(77)
    print("OK" if not failures else "FAIL")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
