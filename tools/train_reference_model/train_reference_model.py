#!/usr/bin/python3
"""Trains peerserve's small reference DeepSeek-V3 model and exports it.

  prepare-data  collect the Debian text into a folder (train/held-out split, manifest)
  run           tokenizer training, tokenization, model training, export in the Hugging
                Face DeepSeek-V3 layout, held-out statistics, samples, reference logits
  time-steps    seconds per training step of a preset on random tokens (no data needed)

Needs only torch (1.13 or 2.x), numpy and the standard library. See
docs/reference_model.md for the architecture, the data and the output files.
"""

import argparse
import hashlib
import json
import os
import platform
import shlex
import sys
import time

import numpy as np
import torch

import bpe_tokenizer
import corpus
import deepseek_v3
import evaluation
import hf_export
import training

HERE = os.path.dirname(os.path.abspath(__file__))

PRESETS = {
    # The shipped model: ~10 M trained parameters (12 M exported, with the MTP layer's
    # copies of the embedding and head), ~3.7 M active per token in the main model.
    "reference": dict(hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                      num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4,
                      q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32,
                      qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16, n_group=4,
                      topk_group=2, num_experts_per_tok=4, n_shared_experts=1),
    # A checkpoint small enough for fast engine tests; same structure, tiny widths.
    "smoke": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2,
                  q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                  v_head_dim=16, n_routed_experts=8, n_group=4, topk_group=2,
                  num_experts_per_tok=2, n_shared_experts=1),
}

SAMPLE_PROMPTS = [
    ("The kernel", "greedy"),
    ("This document describes how to", "sampled"),
    ("Debian is", "sampled"),
]
REFERENCE_PROMPTS = [
    "The Linux kernel is",
    "To configure the network on a Debian system, edit the file",
    "Q: What is a kernel module?\nA:",
]
REFERENCE_CHAT = [{"role": "user", "content": "What is a kernel module?"}]
REFERENCE_HELDOUT_TOKENS = 64


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def hardware(device):
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "device": device.type,
            "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def parameter_counts(model):
    cfg = model.cfg
    trained = sum(p.numel() for p in model.parameters())
    exported = sum(t.numel() for t in deepseek_v3.checkpoint_tensors(model).values())
    active = model.lm_head.weight.numel()
    for i, layer in enumerate(model.model.layers):
        active += sum(p.numel() for p in layer.self_attn.parameters())
        if isinstance(layer.mlp, deepseek_v3.MoE):
            per_expert = sum(p.numel() for p in layer.mlp.experts[0].parameters())
            active += per_expert * cfg.num_experts_per_tok + layer.mlp.gate.weight.numel()
            active += sum(p.numel() for p in layer.mlp.shared_experts.parameters())
        else:
            active += sum(p.numel() for p in layer.mlp.parameters())
    return {"trained": trained, "exported": exported, "active_per_token_main_model": active}


def vocab_size_arg(text):
    """--vocab-size: ids are kept as uint16 (numpy wrapped larger ones without an error)."""
    value = int(text)
    if not 256 <= value <= 65536:
        raise argparse.ArgumentTypeError(f"{value}: expected 256 .. 65536 (ids are stored as uint16)")
    return value


def model_config(preset, vocab_size):
    return deepseek_v3.Config(vocab_size=vocab_size, **PRESETS[preset])


def pick_device(name):
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available to this torch")
    return torch.device(name)


def tokenize_stream(tokenizer, docs):
    """[BOS] doc [EOS] for every document, concatenated, as uint16."""
    out = []
    for d in docs:
        out.append(tokenizer.bos_id)
        out.extend(tokenizer.encode_ordinary(d))
        out.append(tokenizer.eos_id)
    return np.asarray(out, dtype=np.uint16)


def cmd_prepare_data(args):
    corpus.prepare(args.out, log=log)


def cmd_time_steps(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    cfg = model_config(args.preset, args.vocab_size)
    model = deepseek_v3.DeepseekV3(cfg).to(device)
    rng = np.random.default_rng(args.seed)
    stream = rng.integers(0, cfg.vocab_size, size=1_000_000).astype(np.uint16)
    opts = training.TrainOptions(steps=args.warmup + args.steps, batch_size=args.batch_size,
                                 seq_len=args.seq_len, seed=args.seed, log_every=10 ** 9)
    # Time the steps after `warmup` untimed ones (allocator and thread-pool start-up).
    marks = {}

    def on_step(step):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            marks["wall"], marks["cpu"] = time.time(), time.process_time()

    training.train(model, stream, opts, device, log=log, on_step=on_step)
    wall0, cpu0 = marks["wall"], marks["cpu"]
    wall, cpu = time.time() - wall0, time.process_time() - cpu0
    counts = parameter_counts(model)
    result = {"preset": args.preset, "steps_timed": args.steps, "batch_size": args.batch_size,
              "seq_len": args.seq_len, "seconds_per_step": round(wall / args.steps, 3),
              "cpu_seconds_per_step": round(cpu / args.steps, 3),
              "load_average": os.getloadavg(), "parameters": counts,
              "hardware": hardware(device)}
    print(json.dumps(result, indent=1))


def cmd_run(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    command = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    torch.manual_seed(args.seed)
    started = time.time()
    report = {"model": os.path.basename(os.path.normpath(args.out)), "command": command,
              "seed": args.seed, "preset": args.preset, "hardware": hardware(device)}

    # 1. Tokenizer, trained on a deterministic sample of the training documents.
    train_docs = corpus.read_documents(args.data, "train")
    heldout_docs = corpus.read_documents(args.data, "heldout")
    if args.max_train_bytes:
        kept, total = [], 0
        for d in train_docs:
            if total >= args.max_train_bytes:
                break
            kept.append(d)
            total += len(d)
        train_docs = kept
    order = np.random.default_rng(args.seed).permutation(len(train_docs))
    sample, sample_bytes = [], 0
    for i in order:
        if sample_bytes >= args.tokenizer_sample_bytes:
            break
        sample.append(train_docs[i])
        sample_bytes += len(train_docs[i].encode("utf-8"))
    log(f"tokenizer: training on {sample_bytes} bytes")
    tokenizer = bpe_tokenizer.train(sample, args.vocab_size, log=log)

    # 2. Token streams.
    train_stream = tokenize_stream(tokenizer, train_docs)
    heldout_stream = tokenize_stream(tokenizer, heldout_docs)
    heldout_bytes = sum(len(d.encode("utf-8")) for d in heldout_docs)
    log(f"tokens: train {len(train_stream)}, held out {len(heldout_stream)}")
    with open(os.path.join(args.data, "manifest.json"), "rb") as f:
        manifest_sha = hashlib.sha256(f.read()).hexdigest()
    report["data"] = {"manifest_sha256": manifest_sha, "train_documents": len(train_docs),
                      "heldout_documents": len(heldout_docs),
                      "train_tokens": int(len(train_stream)),
                      "heldout_tokens": int(len(heldout_stream))}
    report["tokenizer"] = {"vocab_size": args.vocab_size, "training_bytes": sample_bytes,
                           "heldout_bytes_per_token": round(heldout_bytes / len(heldout_stream), 3)}

    # 3. Training.
    cfg = model_config(args.preset, args.vocab_size)
    model = deepseek_v3.DeepseekV3(cfg).to(device)
    report["parameters"] = parameter_counts(model)
    log(f"model: {report['parameters']}")
    opts = training.TrainOptions(steps=args.steps, batch_size=args.batch_size,
                                 seq_len=args.seq_len, lr=args.lr,
                                 warmup_steps=min(args.warmup_steps, max(1, args.steps // 10)),
                                 mtp_weight=args.mtp_weight,
                                 bias_update_speed=args.bias_update_speed, seed=args.seed,
                                 log_every=args.log_every)
    report["training"] = {"options": vars(opts)}
    report["training"].update(training.train(model, train_stream, opts, device, log=log))

    # 4. Export, then measure everything on the exported BF16 weights.
    files = hf_export.export(model.cpu(), tokenizer, args.out, max_length=cfg.max_position_embeddings)
    log(f"exported {sum(files.values())} bytes to {args.out}")
    model = hf_export.load(args.out).to(device)
    windows = evaluation.windows_from_stream(heldout_stream, args.seq_len + 1,
                                             args.eval_tokens // args.seq_len)
    report["heldout"], report["expert_load"] = evaluation.heldout_metrics(
        model, windows, args.batch_size, device)
    log(f"held out: {report['heldout']}")
    accept_windows = windows[:args.accept_windows, :args.seq_len]
    report["mtp_acceptance"] = evaluation.mtp_acceptance(model, accept_windows,
                                                         max(1, args.batch_size // 2), device)
    report["mtp_acceptance"]["definition"] = (
        "greedy, one draft token: fraction of held-out positions i where argmax MTP(h[i], "
        "Emb(g)) equals argmax p(. | t[0..i], g), g = argmax p(. | t[0..i])")
    log(f"MTP acceptance: {report['mtp_acceptance']}")

    generator = torch.Generator().manual_seed(args.seed)
    samples = []
    for prompt, mode in SAMPLE_PROMPTS:
        ids = tokenizer.encode(prompt)
        seq = evaluation.generate(model, ids, args.sample_tokens, device,
                                  temperature=0.0 if mode == "greedy" else 0.8,
                                  top_k=0 if mode == "greedy" else 40, generator=generator,
                                  stop_id=tokenizer.eos_id)
        samples.append({"prompt": prompt, "mode": mode if mode == "greedy" else
                        "sampled (temperature 0.8, top-k 40)", "text": tokenizer.decode(seq)})
        log(f"sample ({mode}): {samples[-1]['text']!r}")
    report["samples"] = samples

    drafts = accepted = 0
    for w in windows[:args.replay_prompts]:
        prompt = w[:32].tolist()
        seq = evaluation.generate(model, prompt, 64, device)
        d, a = evaluation.speculative_replay(model, seq, len(prompt), device)
        drafts, accepted = drafts + d, accepted + a
    report["mtp_acceptance_greedy_generation"] = {
        "definition": "self-speculative greedy decoding (one MTP draft per step) of 64 new "
                      "tokens after 32-token held-out prompts: accepted drafts / drafts",
        "prompts": min(args.replay_prompts, len(windows)), "drafts": drafts,
        "accepted": accepted, "rate": accepted / max(1, drafts)}
    log(f"MTP acceptance in greedy generation: {report['mtp_acceptance_greedy_generation']}")

    # 5. Reference logits: float32 on the CPU from the exported BF16 weights.
    ref_model = hf_export.load(args.out)
    prompts = [(p, tokenizer.encode(p)) for p in REFERENCE_PROMPTS]
    chat_text = bpe_tokenizer.render_chat(REFERENCE_CHAT)
    prompts.append((chat_text, tokenizer.encode(chat_text, add_bos=False)))
    held_ids = [tokenizer.bos_id] + [int(t) for t in heldout_stream[1:REFERENCE_HELDOUT_TOKENS]]
    prompts.append((tokenizer.decode(held_ids), held_ids))
    ref_dir = os.path.join(args.out, "reference")
    os.makedirs(ref_dir, exist_ok=True)
    margins = evaluation.reference_fixture(
        ref_model, prompts, os.path.join(ref_dir, "logits.safetensors"),
        {"format": "peerserve-reference-logits-1", "compute_dtype": "float32",
         "weights": "the BF16 safetensors of this model folder, widened to float32",
         "torch_version": torch.__version__})
    report["reference_logits"] = {"file": "reference/logits.safetensors",
                                  "prompts": len(prompts),
                                  "rows": sum(len(ids) for _, ids in prompts),
                                  "min_selection_margin": margins}
    report["total_seconds"] = round(time.time() - started, 1)
    report["files"] = {n: os.path.getsize(os.path.join(args.out, n))
                       for n in sorted(os.listdir(args.out))
                       if os.path.isfile(os.path.join(args.out, n))}
    report["files"]["reference/logits.safetensors"] = os.path.getsize(
        os.path.join(ref_dir, "logits.safetensors"))
    with open(os.path.join(args.out, "training_report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, ensure_ascii=False)
        f.write("\n")
    total = sum(report["files"].values())
    log(f"done in {report['total_seconds']} s; {args.out} holds {total} bytes")
    if total > 30 * 1000 * 1000:
        raise SystemExit(f"{args.out} is {total} bytes, more than the 30 MB budget")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare-data", help="collect the Debian text")
    p.add_argument("--out", default=os.path.join(HERE, "data"))
    p.set_defaults(func=cmd_prepare_data)

    def common(p):
        p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
        p.add_argument("--preset", choices=sorted(PRESETS), default="reference")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--batch-size", type=int, default=8)
        p.add_argument("--seq-len", type=int, default=256)
        p.add_argument("--vocab-size", type=vocab_size_arg, default=4096,
                       help="256 .. 65536: the token streams are stored as uint16")
        p.add_argument("--threads", type=int, default=0,
                       help="torch CPU threads (0: torch's default)")

    p = sub.add_parser("run", help="train, export, measure")
    common(p)
    p.add_argument("--data", default=os.path.join(HERE, "data"))
    p.add_argument("--out", required=True, help="model folder, e.g. models/NAME")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--bias-update-speed", type=float, default=0.001)
    p.add_argument("--tokenizer-sample-bytes", type=int, default=8_000_000)
    p.add_argument("--max-train-bytes", type=int, default=0,
                   help="use only the training documents within the first N characters "
                        "(code points, not UTF-8 bytes, despite the name; 0: all)")
    p.add_argument("--eval-tokens", type=int, default=65536)
    p.add_argument("--accept-windows", type=int, default=64)
    p.add_argument("--replay-prompts", type=int, default=16)
    p.add_argument("--sample-tokens", type=int, default=96)
    p.add_argument("--log-every", type=int, default=50)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("time-steps", help="seconds per training step on random tokens")
    common(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.set_defaults(func=cmd_time_steps)

    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
