#!/usr/bin/python3
"""A second, independent DeepSeek-V3 forward pass (numpy, float64, one token at a time)
that checks a model folder's reference logits.

It shares no code with the training script: it parses the safetensors shards itself,
computes YaRN RoPE with complex numbers, and runs MLA in its weight-absorbed decode form
over a latent cache [c_kv ; k_pe] (the form a serving engine uses for decode), token by
token, with the MoE routing written as plain loops. The MTP layer runs the same way on
(h[p], token[p+1]) at position p.

  /usr/bin/python3 numpy_reference.py MODEL_DIR [--tolerance 1e-4]

Exit status 0 when every logit of reference/logits.safetensors is within tolerance
(|ref - numpy| <= tolerance * max(1, max |numpy row|)), 1 otherwise.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = data[8 + n + b:8 + n + e]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype={"F32": "<f4", "I32": "<i4", "I64": "<i8"}[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).astype(
            np.float64 if info["dtype"] in ("BF16", "F32") else np.int64)
    return out, meta


def load_weights(model_dir):
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for name in files:
        w.update(read_safetensors(os.path.join(model_dir, name))[0])
    return w


def rms(x, weight, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * weight


def silu(x):
    return x / (1.0 + np.exp(-x))


class Reference:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.c = json.load(f)
        self.w = load_weights(model_dir)
        c = self.c
        d = c["qk_rope_head_dim"]
        base = c["rope_theta"]
        freq = base ** (-np.arange(0, d, 2) / d)
        self.rope_scale = 1.0
        self.softmax_scale = 1.0 / math.sqrt(c["qk_nope_head_dim"] + d)
        rs = c.get("rope_scaling")
        if rs:
            s, orig = rs["factor"], rs["original_max_position_embeddings"]
            dim_of = lambda r: d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
            lo = max(math.floor(dim_of(rs["beta_fast"])), 0)
            hi = min(math.ceil(dim_of(rs["beta_slow"])), d - 1)
            ramp = np.clip((np.arange(d // 2) - lo) / ((hi - lo) or 0.001), 0, 1)
            freq = (freq / s) * ramp + freq * (1 - ramp)
            m = lambda k: 0.1 * k * math.log(s) + 1 if s > 1 else 1.0
            self.rope_scale = m(rs.get("mscale", 1)) / m(rs.get("mscale_all_dim", 0))
            if rs.get("mscale_all_dim", 0):
                self.softmax_scale *= m(rs["mscale_all_dim"]) ** 2
        self.freq = freq

    def rope(self, x, pos):
        z = x[..., 0::2] + 1j * x[..., 1::2]
        z = z * np.exp(1j * pos * self.freq) * self.rope_scale
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    def attention(self, p, a, pos, cache):
        c, w = self.c, self.w
        nh, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                          c["qk_rope_head_dim"], c["v_head_dim"])
        eps = c["rms_norm_eps"]
        q = w[p + "q_b_proj.weight"] @ rms(w[p + "q_a_proj.weight"] @ a,
                                           w[p + "q_a_layernorm.weight"], eps)
        q = q.reshape(nh, dn + dr)
        kv = w[p + "kv_a_proj_with_mqa.weight"] @ a
        latent = rms(kv[:c["kv_lora_rank"]], w[p + "kv_a_layernorm.weight"], eps)
        cache.append((latent, self.rope(kv[c["kv_lora_rank"]:], pos)))
        wkv = w[p + "kv_b_proj.weight"].reshape(nh, dn + dv, c["kv_lora_rank"])
        q_latent = np.einsum("hd,hdc->hc", q[:, :dn], wkv[:, :dn])
        q_pe = self.rope(q[:, dn:], pos)
        lat = np.stack([e[0] for e in cache])
        kpe = np.stack([e[1] for e in cache])
        scores = (q_latent @ lat.T + q_pe @ kpe.T) * self.softmax_scale
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.einsum("hc,hvc->hv", probs @ lat, wkv[:, dn:])
        return w[p + "o_proj.weight"] @ out.reshape(-1)

    def mlp(self, p, x):
        w = self.w
        return w[p + "down_proj.weight"] @ (silu(w[p + "gate_proj.weight"] @ x) *
                                            (w[p + "up_proj.weight"] @ x))

    def moe(self, p, x):
        c, w = self.c, self.w
        e_count, groups = c["n_routed_experts"], c["n_group"]
        per = e_count // groups
        scores = 1.0 / (1.0 + np.exp(-(w[p + "gate.weight"] @ x)))
        choice = scores + w[p + "gate.e_score_correction_bias"]
        group_score = [sum(sorted(choice[g * per:(g + 1) * per])[-2:]) for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: -group_score[g])[:c["topk_group"]]
        candidates = [e for e in range(e_count) if e // per in kept]
        chosen = sorted(candidates, key=lambda e: -choice[e])[:c["num_experts_per_tok"]]
        weights = np.array([scores[e] for e in chosen])
        if c["norm_topk_prob"]:
            weights = weights / (weights.sum() + 1e-20)
        weights *= c["routed_scaling_factor"]
        out = self.mlp(p + "shared_experts.", x)
        for e, g in zip(chosen, weights):
            out = out + g * self.mlp(p + f"experts.{e}.", x)
        return out

    def layer(self, index, x, pos, cache):
        p = f"model.layers.{index}."
        eps = self.c["rms_norm_eps"]
        x = x + self.attention(p + "self_attn.", rms(x, self.w[p + "input_layernorm.weight"], eps),
                               pos, cache)
        a = rms(x, self.w[p + "post_attention_layernorm.weight"], eps)
        moe = index >= self.c["first_k_dense_replace"]
        return x + (self.moe(p + "mlp.", a) if moe else self.mlp(p + "mlp.", a))

    def run(self, ids):
        """Main logits [n, V], final hidden states [n, H] and MTP logits [n - 1, V]."""
        c, w = self.c, self.w
        n_layers, eps = c["num_hidden_layers"], c["rms_norm_eps"]
        caches = [[] for _ in range(n_layers)]
        logits, hidden = [], []
        for pos, tok in enumerate(ids):
            x = w["model.embed_tokens.weight"][tok]
            for i in range(n_layers):
                x = self.layer(i, x, pos, caches[i])
            h = rms(x, w["model.norm.weight"], eps)
            hidden.append(h)
            logits.append(w["lm_head.weight"] @ h)
        mtp_logits = []
        m = f"model.layers.{n_layers}."
        mtp_cache = []
        for pos in range(len(ids) - 1):
            e = rms(w[m + "embed_tokens.weight"][ids[pos + 1]], w[m + "enorm.weight"], eps)
            x = w[m + "eh_proj.weight"] @ np.concatenate([e, rms(hidden[pos], w[m + "hnorm.weight"], eps)])
            x = self.layer(n_layers, x, pos, mtp_cache)
            mtp_logits.append(w[m + "shared_head.head.weight"] @
                              rms(x, w[m + "shared_head.norm.weight"], eps))
        return np.array(logits), np.array(hidden), np.array(mtp_logits)


def relative_error(ref, mine):
    scale = np.maximum(1.0, np.abs(mine).max(-1, keepdims=True))
    return float((np.abs(ref - mine) / scale).max())


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    fixture, meta = read_safetensors(os.path.join(args.model_dir, "reference", "logits.safetensors"))
    ref = Reference(args.model_dir)
    worst = 0.0
    for p in range(int(meta["prompt_count"])):
        ids = [int(t) for t in fixture[f"prompts.{p}.input_ids"]]
        logits, _, mtp = ref.run(ids)
        e_main = relative_error(fixture[f"prompts.{p}.logits"], logits)
        e_mtp = relative_error(fixture[f"prompts.{p}.mtp_logits"], mtp)
        # A NaN error is the worst (Python's max(0.0, nan) is 0.0: NaN logits passed).
        worst = max(worst, e_main, e_mtp, key=lambda e: math.inf if math.isnan(e) else e)
        print(f"prompt {p} ({len(ids)} tokens): max relative error logits {e_main:.2e}, "
              f"MTP logits {e_mtp:.2e}")
    ok = worst <= args.tolerance  # False for NaN
    print(f"{'OK' if ok else 'FAIL'}: worst {worst:.2e}, tolerance {args.tolerance:.0e}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
