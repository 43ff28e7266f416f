#!/usr/bin/python3
"""Independent numpy transcriptions of Hugging Face's modeling_deepseek.py pieces, used as
test references by tests/model: the MoE gate (MoEGate.forward) and the YaRN rotary tables
(DeepseekV3YarnRotaryEmbedding, yarn_get_mscale, the attention softmax_scale).

Reads one JSON request on stdin, writes one JSON answer on stdout.
  {"op": "gate", "config": {...}, "logits": [[...]], "bias": [...] or null}
      -> {"ids": [[...]], "weights": [[...]]}
  {"op": "yarn", "config": {...}, "positions": [...]}
      -> {"inv_freq": [...], "cos": [[...]], "sin": [[...]], "mscale": x, "softmax_scale": x}
"""
import json
import math
import sys

import numpy as np

f32 = np.float32


def gate(cfg, logits, bias):
    logits = np.asarray(logits, dtype=f32)
    n_tok, n_exp = logits.shape
    if cfg["scoring_func"] == "sigmoid":
        scores = (f32(1) / (f32(1) + np.exp(-logits))).astype(f32)
    else:
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores = (e / e.sum(axis=-1, keepdims=True)).astype(f32)
    method = cfg["topk_method"]
    n_group, topk_group, top_k = cfg["n_group"], cfg["topk_group"], cfg["top_k"]
    ids, weights = [], []
    for t in range(n_tok):
        s = scores[t]
        choice = s + np.asarray(bias, dtype=f32) if method == "noaux_tc" else s.copy()
        if method in ("noaux_tc", "group_limited_greedy"):
            g = choice.reshape(n_group, -1)
            if method == "noaux_tc":
                group_scores = np.sort(g, axis=-1)[:, -2:].sum(axis=-1)
            else:
                group_scores = g.max(axis=-1)
            keep = np.argsort(-group_scores, kind="stable")[:topk_group]
            group_mask = np.zeros(n_group, dtype=bool)
            group_mask[keep] = True
            choice = np.where(np.repeat(group_mask, n_exp // n_group), choice, -np.inf)
        idx = np.argsort(-choice, kind="stable")[:top_k]
        w = s[idx].astype(f32)
        normalise = top_k > 1 and cfg["norm_topk_prob"]
        if normalise:
            w = w / (w.sum() + f32(1e-20))
        if cfg["arch"] == "v3" or not normalise:
            w = w * f32(cfg["routed_scaling_factor"])
        ids.append([int(i) for i in idx])
        weights.append([float(x) for x in w])
    return {"ids": ids, "weights": weights}


def yarn_get_mscale(scale=1, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn(cfg, positions):
    dim, base = cfg["dim"], cfg["base"]
    arange = np.arange(0, dim, 2, dtype=f32) / f32(dim)
    freq_extra = (f32(1.0) / (f32(base) ** arange)).astype(f32)
    mscale = 1.0
    softmax_scale = cfg["qk_head_dim"] ** -0.5
    if cfg.get("factor") is None:
        inv_freq = freq_extra
    else:
        factor = cfg["factor"]
        freq_inter = (f32(1.0) / (f32(factor) * f32(base) ** arange)).astype(f32)

        def correction_dim(num_rotations):
            return (dim * math.log(cfg["original_max_position_embeddings"] /
                                   (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(correction_dim(cfg["beta_fast"])), 0)
        high = min(math.ceil(correction_dim(cfg["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=f32) - low) / (high - low), 0, 1).astype(f32)
        extra_mask = f32(1.0) - ramp
        inv_freq = (freq_inter * (f32(1) - extra_mask) + freq_extra * extra_mask).astype(f32)
        mscale = yarn_get_mscale(factor, cfg["mscale"]) / yarn_get_mscale(factor, cfg["mscale_all_dim"])
        if cfg["mscale_all_dim"]:
            m = yarn_get_mscale(factor, cfg["mscale_all_dim"])
            softmax_scale = softmax_scale * m * m
    t = np.asarray(positions, dtype=f32)
    freqs = np.outer(t, inv_freq).astype(f32)
    cos = (np.cos(freqs.astype(np.float64)).astype(f32) * f32(mscale)).astype(f32)
    sin = (np.sin(freqs.astype(np.float64)).astype(f32) * f32(mscale)).astype(f32)
    return {"inv_freq": [float(x) for x in inv_freq], "cos": cos.tolist(), "sin": sin.tolist(),
            "mscale": mscale, "softmax_scale": softmax_scale}


def main():
    request = json.load(sys.stdin)
    if request["op"] == "gate":
        answer = gate(request["config"], request["logits"], request.get("bias"))
    else:
        answer = yarn(request["config"], request["positions"])
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
