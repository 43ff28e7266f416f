"""DeepSeek-V3 at a small scale, in PyTorch (float32), for training and as a reference.

Written from the DeepSeek-V3 technical report (arXiv:2412.19437): §2.1.1 multi-head latent
attention with a low-rank query and a decoupled RoPE key, §2.1.2 DeepSeekMoE with sigmoid
affinities, group-limited top-k, a shared expert and auxiliary-loss-free balancing (plus
the tiny complementary sequence-wise balance loss), §2.2 multi-token prediction. Where the
report leaves a detail open, the choice matches the Hugging Face release of the model
(config.json keys, tensor names, RoPE pairs, YaRN), since that is what serving engines
load:

- RoPE rotates interleaved pairs (x[2i], x[2i+1]) by angle pos * inv_freq[i].
- YaRN (config "rope_scaling": {"type": "yarn", ...}): inv_freq blends the original
  frequencies (kept for the fastest-rotating dims) with frequencies divided by `factor`
  (for the slowest), with a linear ramp between the correction dims of beta_fast and
  beta_slow; cos/sin are scaled by mscale(factor, mscale) / mscale(factor,
  mscale_all_dim) and the attention softmax scale by mscale(factor, mscale_all_dim)^2,
  where mscale(s, m) = 0.1 * m * ln(s) + 1. Applied whenever rope_scaling is present.
- Routing: s = sigmoid(x W_g^T); choice = s + e_score_correction_bias; a group's score is
  the sum of its two best choices; the topk_group best groups stay eligible; the top
  num_experts_per_tok eligible choices are taken; their weights are the *unbiased* s,
  divided by their sum (norm_topk_prob) and multiplied by routed_scaling_factor.
- MTP module k=1 (the layer after the last main layer): input at position i is
  eh_proj([enorm(Emb(t[i+1])); hnorm(h[i])]) (embedding first, as the released eh_proj
  weights expect), where h[i] is the main model's final hidden state *after* model.norm
  (the vector lm_head reads), then one full decoder layer at position i (causal over the
  MTP sequence), then shared_head.norm and the output head shared with the main model;
  it predicts t[i+2]. No position is masked.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    """Hyperparameters, named as DeepSeek-V3's config.json names them."""
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    moe_intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_nextn_predict_layers: int = 1
    num_attention_heads: int = 4
    n_shared_experts: int = 1
    n_routed_experts: int = 16
    routed_scaling_factor: float = 2.5
    n_group: int = 4
    topk_group: int = 2
    num_experts_per_tok: int = 4
    first_k_dense_replace: int = 1
    norm_topk_prob: bool = True
    q_lora_rank: int = 128
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = dataclasses.field(default_factory=lambda: {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"})
    aux_loss_alpha: float = 0.0001
    initializer_range: float = 0.02
    bos_token_id: int = 0
    eos_token_id: int = 1

    def validate(self):
        if self.n_routed_experts % self.n_group:
            raise ValueError("n_routed_experts must be a multiple of n_group")
        if self.n_routed_experts // self.n_group < 2:
            raise ValueError("each expert group needs at least 2 experts (group score = top-2 sum)")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError("topk_group must be in [1, n_group]")
        if self.num_experts_per_tok > self.topk_group * (self.n_routed_experts // self.n_group):
            raise ValueError("num_experts_per_tok exceeds the experts of topk_group groups")
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even")

    def hf_config(self):
        """config.json with every model field of DeepSeek-V3's (left out: auto_map, which
        names Python files not shipped here; quantization_config, since the weights are
        BF16, not FP8; transformers_version, since transformers did not write it)."""
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "aux_loss_alpha": self.aux_loss_alpha,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "ep_size": 1,
            "first_k_dense_replace": self.first_k_dense_replace,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "kv_lora_rank": self.kv_lora_rank,
            "max_position_embeddings": self.max_position_embeddings,
            "model_type": "deepseek_v3",
            "moe_intermediate_size": self.moe_intermediate_size,
            "moe_layer_freq": 1,
            "n_group": self.n_group,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "norm_topk_prob": self.norm_topk_prob,
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_attention_heads,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "pretraining_tp": 1,
            "q_lora_rank": self.q_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_theta": int(self.rope_theta) if float(self.rope_theta).is_integer()
                          else self.rope_theta,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sigmoid",
            "seq_aux": True,
            "tie_word_embeddings": False,
            "topk_group": self.topk_group,
            "topk_method": "noaux_tc",
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "v_head_dim": self.v_head_dim,
            "vocab_size": self.vocab_size,
        }

    @classmethod
    def from_hf(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(cfg):
    """(inv_freq as float64 [qk_rope_head_dim / 2], cos/sin scale, softmax scale)."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    softmax_scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rs = cfg.rope_scaling
    if not rs:
        return inv_freq, 1.0, softmax_scale
    if rs.get("type", rs.get("rope_type")) != "yarn":
        raise ValueError(f"rope_scaling type {rs} is not yarn")
    factor = float(rs["factor"])
    orig = float(rs["original_max_position_embeddings"])

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(rs.get("beta_slow", 1))), dim - 1)
    span = (high - low) if high != low else 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0, 1)
    keep = 1.0 - ramp  # 1: original frequency, 0: interpolated (divided by factor)
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    mscale = rs.get("mscale", 1.0)
    mscale_all_dim = rs.get("mscale_all_dim", 0.0)
    cos_sin_scale = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    if mscale_all_dim:
        softmax_scale *= yarn_mscale(factor, mscale_all_dim) ** 2
    return inv_freq, cos_sin_scale, softmax_scale


def apply_rope(x, cos, sin):
    """Rotates interleaved pairs of the last dim of x [B, T, heads, d] by cos/sin [B, T, d/2]."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


class MLA(nn.Module):
    """Multi-head latent attention, computed in its plain (non-absorbed) form."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh = cfg.hidden_size, cfg.num_attention_heads
        self.q_a_proj = linear(h, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = linear(cfg.q_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim))
        self.kv_a_proj_with_mqa = linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.o_proj = linear(nh * cfg.v_head_dim, h)
        self.softmax_scale = rope_parameters(cfg)[2]

    def forward(self, x, cos, sin, mask):
        c = self.cfg
        b, t, _ = x.shape
        nh, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, nh, dn + dr)
        q_nope, q_pe = q.split([dn, dr], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, nh, dn + dv)
        k_nope, v = kv.split([dn, dv], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin)
        k_pe = apply_rope(k_pe.view(b, t, 1, dr), cos, sin).expand(b, t, nh, dr)
        q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)  # [b, nh, t, dn + dr]
        k = torch.cat([k_nope, k_pe], dim=-1).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.softmax_scale
        scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v.transpose(1, 2)).transpose(1, 2).reshape(b, t, nh * dv)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = linear(hidden, inter)
        self.up_proj = linear(hidden, inter)
        self.down_proj = linear(inter, hidden)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        # Moved by the balancing rule after each step, never by gradients.
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.n_routed_experts))
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.last_load = None       # tokens per expert in the last forward
        self.last_balance_loss = None
        self.last_topk = None       # (expert ids, weights) of the last forward
        self.load_totals = None     # summed over forwards while collecting statistics

    def route(self, x):
        """x [n, hidden] -> (expert ids [n, k], weights [n, k], affinities s [n, E])."""
        c = self.cfg
        scores = torch.sigmoid(F.linear(x, self.gate.weight))
        choice = scores.detach() + self.gate.e_score_correction_bias
        n, per_group = x.shape[0], c.n_routed_experts // c.n_group
        group_scores = choice.view(n, c.n_group, per_group).topk(2, dim=-1).values.sum(-1)
        groups = group_scores.topk(c.topk_group, dim=-1).indices
        eligible = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        eligible = eligible.unsqueeze(-1).expand(n, c.n_group, per_group).reshape(n, -1)
        ids = choice.masked_fill(~eligible, float("-inf")).topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, ids)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return ids, weights * c.routed_scaling_factor, scores

    def forward(self, x):
        c = self.cfg
        b, t, h = x.shape
        flat = x.reshape(-1, h)
        ids, weights, scores = self.route(flat)
        k = c.num_experts_per_tok
        slots = ids.reshape(-1)
        order = slots.argsort()
        counts = torch.bincount(slots, minlength=c.n_routed_experts)
        token_of_slot = order // k
        slot_weight = weights.reshape(-1)[order].unsqueeze(-1)
        # split() (not slicing) so that the backward pass concatenates the expert
        # gradients once instead of adding one full-size gradient per expert.
        groups = flat[token_of_slot].split(counts.tolist())
        outputs = [self.experts[e](g) for e, g in enumerate(groups) if g.shape[0]]
        routed = torch.zeros_like(flat).index_add_(0, token_of_slot,
                                                   torch.cat(outputs) * slot_weight)
        self.last_load = counts.detach().float()
        self.last_topk = (ids.detach(), weights.detach())
        if self.load_totals is not None:
            self.load_totals += counts.detach().double().cpu()
        if self.training and c.aux_loss_alpha > 0:
            # Complementary sequence-wise balance loss (report eq. 17-20).
            hits = torch.zeros(b, t, c.n_routed_experts, device=x.device)
            hits.scatter_(2, ids.view(b, t, k), 1.0)
            f = hits.mean(1) * (c.n_routed_experts / k)
            p = (scores / scores.sum(-1, keepdim=True)).view(b, t, -1).mean(1)
            self.last_balance_loss = c.aux_loss_alpha * (f * p).sum(-1).mean()
        else:
            self.last_balance_loss = None
        return (routed + self.shared_experts(flat)).view(b, t, h)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, index):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        dense = index < cfg.first_k_dense_replace
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size) if dense else MoE(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedHead(nn.Module):
    """The MTP module's final norm; its output matrix is the main model's lm_head."""

    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MTPLayer(DecoderLayer):
    def __init__(self, cfg, index):
        super().__init__(cfg, index)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = linear(2 * cfg.hidden_size, cfg.hidden_size)
        self.shared_head = SharedHead(cfg)


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def causal_mask(t, device):
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


class DeepseekV3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = linear(cfg.hidden_size, cfg.vocab_size)
        self.mtp = nn.ModuleList(MTPLayer(cfg, cfg.num_hidden_layers + d)
                                 for d in range(cfg.num_nextn_predict_layers))
        inv_freq, self.cos_sin_scale, _ = rope_parameters(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._init_weights()

    def _init_weights(self):
        std = self.cfg.initializer_range
        residual_std = std / math.sqrt(2 * (self.cfg.num_hidden_layers + len(self.mtp)))
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):  # every RMSNorm, including *_layernorm
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def moe_layers(self):
        """{layer index in the checkpoint: MoE} for the main and the MTP layers."""
        out = {}
        for i, layer in enumerate(list(self.model.layers) + list(self.mtp)):
            if isinstance(layer.mlp, MoE):
                out[i] = layer.mlp
        return out

    def rope(self, positions):
        angles = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq
        s = self.cos_sin_scale
        return (angles.cos() * s).float(), (angles.sin() * s).float()

    def forward(self, ids, positions=None, mask=None):
        """ids [B, T] -> (logits [B, T, V], final hidden state after model.norm [B, T, H]).
        positions [B, T] default to 0..T-1; mask [T, T] or [B, T, T] (True: may attend)
        defaults to causal."""
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t, device=ids.device).expand(b, t)
        if mask is None:
            mask = causal_mask(t, ids.device)
        cos, sin = self.rope(positions)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        h = self.model.norm(x)
        return self.lm_head(h), h

    def mtp_forward(self, h, next_ids, positions=None, mask=None, depth=0):
        """MTP module `depth`: h [B, T, H] (main hidden states at positions i) and
        next_ids [B, T] (the tokens t[i+1]) -> logits for t[i+2] [B, T, V]."""
        layer = self.mtp[depth]
        b, t = next_ids.shape
        if positions is None:
            positions = torch.arange(t, device=h.device).expand(b, t)
        if mask is None:
            mask = causal_mask(t, h.device)
        cos, sin = self.rope(positions)
        e = self.model.embed_tokens(next_ids)
        x = layer.eh_proj(torch.cat([layer.enorm(e), layer.hnorm(h)], dim=-1))
        x = layer(x, cos, sin, mask)
        return self.lm_head(layer.shared_head.norm(x))


def checkpoint_tensors(model):
    """The model's tensors under DeepSeek-V3's Hugging Face names (float32, shared
    embedding and head copied into each MTP layer)."""
    cfg = model.cfg
    out = {}
    for name, t in model.state_dict().items():
        if name.startswith("mtp."):
            depth, rest = name[len("mtp."):].split(".", 1)
            name = f"model.layers.{cfg.num_hidden_layers + int(depth)}.{rest}"
        out[name] = t.detach()
    for d in range(len(model.mtp)):
        prefix = f"model.layers.{cfg.num_hidden_layers + d}."
        out[prefix + "embed_tokens.weight"] = model.model.embed_tokens.weight.detach()
        out[prefix + "shared_head.head.weight"] = model.lm_head.weight.detach()
    return out


def load_checkpoint_tensors(model, tensors):
    """Inverse of checkpoint_tensors(): fills `model` (float32) from {name: tensor}."""
    cfg = model.cfg
    state = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if name.startswith("model.layers.") and int(parts[2]) >= cfg.num_hidden_layers:
            depth = int(parts[2]) - cfg.num_hidden_layers
            rest = ".".join(parts[3:])
            if rest in ("embed_tokens.weight", "shared_head.head.weight"):
                continue  # copies of the shared embedding and head
            name = f"mtp.{depth}.{rest}"
        state[name] = t.float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not fit the model: missing {missing}, "
                         f"unexpected {unexpected}")
