"""Writes a trained model in the Hugging Face DeepSeek-V3 layout and reads it back.

Layout: config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
model-0000i-of-0000n.safetensors (BF16; e_score_correction_bias F32 as in DeepSeek-V3's
release) and model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}).
"""

import json
import os
import re

import torch

import bpe_tokenizer
import deepseek_v3
import safetensors_file

SHARD_BYTES = 10 * 1000 * 1000


def _order_key(name):
    """embed_tokens, then layers in numeric order, then norm and lm_head."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    if m:
        return (1, int(m.group(1)), name)
    return (0 if "embed_tokens" in name else 2, 0, name)


def export(model, tokenizer, out_dir, max_length):
    """Writes every file of the model folder; returns {file: bytes}."""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if re.match(r"model-\d+-of-\d+\.safetensors$", name):
            os.remove(os.path.join(out_dir, name))
    tensors = {}
    for name, t in sorted(deepseek_v3.checkpoint_tensors(model).items(),
                          key=lambda kv: _order_key(kv[0])):
        keep_f32 = name.endswith("e_score_correction_bias")
        tensors[name] = t.float().cpu() if keep_f32 else t.float().cpu().to(torch.bfloat16)
    shards, current, size = [], {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = t
        size += nbytes
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors_file.write(os.path.join(out_dir, fname), shard, {"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    files = {
        "model.safetensors.index.json": {"metadata": {"total_size": total},
                                         "weight_map": dict(sorted(weight_map.items()))},
        "config.json": model.cfg.hf_config(),
        "generation_config.json": {"_from_model_config": True,
                                   "bos_token_id": model.cfg.bos_token_id,
                                   "eos_token_id": model.cfg.eos_token_id,
                                   "do_sample": True, "temperature": 0.6, "top_p": 0.95},
        "tokenizer.json": bpe_tokenizer.tokenizer_json(tokenizer),
        "tokenizer_config.json": bpe_tokenizer.tokenizer_config_json(max_length),
    }
    for fname, data in files.items():
        with open(os.path.join(out_dir, fname), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return {n: os.path.getsize(os.path.join(out_dir, n)) for n in sorted(os.listdir(out_dir))
            if os.path.isfile(os.path.join(out_dir, n))}


def load(model_dir):
    """Reads an exported folder into a float32 DeepseekV3 (BF16 weights widened)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = deepseek_v3.Config.from_hf(json.load(f))
    with open(os.path.join(model_dir, "model.safetensors.index.json"), encoding="utf-8") as f:
        index = json.load(f)
    tensors = {}
    for fname in sorted(set(index["weight_map"].values())):
        part, _ = safetensors_file.read(os.path.join(model_dir, fname))
        tensors.update(part)
    if set(tensors) != set(index["weight_map"]):
        raise ValueError(f"{model_dir}: shards and index name different tensors")
    model = deepseek_v3.DeepseekV3(cfg)
    deepseek_v3.load_checkpoint_tensors(model, tensors)
    model.eval()
    return model
