"""Measurements of a trained model on held-out text, and the reference-logits fixture.

MTP draft acceptance (one draft token, greedy), as speculative decoding uses it: for each
held-out prefix t[0..i], the main model's greedy next token is g = argmax p(. | t[0..i]);
the MTP module drafts d = argmax MTP(h[i], Emb(g)) (its own earlier positions built from
the accepted prefix, i.e. from h[j] and t[j+1] for j < i); the main model then verifies
with G = argmax p(. | t[0..i], g). The draft is accepted when d == G. The rate is the
fraction of held-out positions i where it is. Both branches are computed for all i of a
window at once with a tree-shaped attention mask: the branch token at i sees the prefix
0..i and itself.
"""

import math

import torch
import torch.nn.functional as F

import deepseek_v3
import safetensors_file


def windows_from_stream(stream, length, count):
    """Up to `count` non-overlapping windows of `length` tokens from the token stream."""
    n = min(count, len(stream) // length)
    return torch.as_tensor(stream[:n * length].astype("int64")).view(n, length)


@torch.no_grad()
def heldout_metrics(model, windows, batch_size, device):
    """Perplexity of the main model and of the MTP module, and expert load per MoE layer."""
    moes = model.moe_layers()
    for moe in moes.values():
        moe.load_totals = torch.zeros(model.cfg.n_routed_experts, dtype=torch.float64)
    nll = mtp_nll = 0.0
    count = mtp_count = 0
    for start in range(0, windows.shape[0], batch_size):
        w = windows[start:start + batch_size].to(device)
        logits, h = model(w[:, :-1])
        nll += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
        mtp_logits = model.mtp_forward(h[:, :-1], w[:, 1:-1])
        mtp_nll += F.cross_entropy(mtp_logits.flatten(0, 1), w[:, 2:].flatten(),
                                   reduction="sum").item()
        mtp_count += w[:, 2:].numel()
    load = {}
    for index, moe in moes.items():
        counts = moe.load_totals
        moe.load_totals = None
        mean = counts.mean().item()
        load[str(index)] = {
            "fraction": [round(c / counts.sum().item(), 5) for c in counts.tolist()],
            "max_over_mean": round(counts.max().item() / mean, 4),
            "min_over_mean": round(counts.min().item() / mean, 4),
            "coefficient_of_variation": round((counts - mean).pow(2).mean().sqrt().item() / mean, 4),
            "e_score_correction_bias": [round(b, 5) for b in
                                        moe.gate.e_score_correction_bias.tolist()],
        }
    return {
        "tokens": count,
        "loss": nll / count,
        "perplexity": math.exp(nll / count),
        "mtp_loss": mtp_nll / mtp_count,
        "mtp_perplexity": math.exp(mtp_nll / mtp_count),
    }, {"tokens": count, "layers": load}


def _tree_masks(t, device):
    """Masks for the main pass [prefix t; branch t] and the MTP pass [prefix t-1; branch t]."""
    main = torch.zeros(2 * t, 2 * t, dtype=torch.bool, device=device)
    main[:t, :t] = deepseek_v3.causal_mask(t, device)
    main[t:, :t] = deepseek_v3.causal_mask(t, device)      # branch i sees prefix 0..i
    main[t:, t:] = torch.eye(t, dtype=torch.bool, device=device)
    mtp = torch.zeros(2 * t - 1, 2 * t - 1, dtype=torch.bool, device=device)
    mtp[:t - 1, :t - 1] = deepseek_v3.causal_mask(t - 1, device)
    mtp[t - 1:, :t - 1] = torch.ones(t, t - 1, device=device).tril(-1).bool()  # sees 0..i-1
    mtp[t - 1:, t - 1:] = torch.eye(t, dtype=torch.bool, device=device)
    return main, mtp


@torch.no_grad()
def mtp_acceptance(model, windows, batch_size, device):
    """Greedy one-token MTP draft acceptance over every position of the windows."""
    accepted = total = 0
    max_prefix_error = 0.0
    t = windows.shape[1]
    main_mask, mtp_mask = _tree_masks(t, device)
    ar = torch.arange(t, device=device)
    main_pos = torch.cat([ar, ar + 1])
    mtp_pos = torch.cat([ar[:-1], ar])
    for start in range(0, windows.shape[0], batch_size):
        w = windows[start:start + batch_size].to(device)
        b = w.shape[0]
        logits, h = model(w)
        g = logits.argmax(-1)
        tree_logits, _ = model(torch.cat([w, g], 1), main_pos.expand(b, -1), main_mask)
        max_prefix_error = max(max_prefix_error,
                               (tree_logits[:, :t] - logits).abs().max().item())
        verified = tree_logits[:, t:].argmax(-1)
        mtp_logits = model.mtp_forward(torch.cat([h[:, :-1], h], 1),
                                       torch.cat([w[:, 1:], g], 1),
                                       mtp_pos.expand(b, -1), mtp_mask)
        drafted = mtp_logits[:, t - 1:].argmax(-1)
        accepted += (drafted == verified).sum().item()
        total += drafted.numel()
    if max_prefix_error > 1e-3:
        raise RuntimeError(f"tree-masked pass disagrees with the causal pass by "
                           f"{max_prefix_error}: the mask or positions are wrong")
    return {"positions": total, "accepted": accepted, "rate": accepted / total}


@torch.no_grad()
def generate(model, ids, new_tokens, device, temperature=0.0, top_k=0, generator=None,
             stop_id=None):
    """Continues `ids` (list) by recomputing the whole sequence each step."""
    seq = list(ids)
    for _ in range(new_tokens):
        logits, _ = model(torch.tensor([seq], device=device))
        last = logits[0, -1]
        if temperature <= 0:
            nxt = int(last.argmax())
        else:
            last = last / temperature
            if top_k:
                kth = last.topk(top_k).values[-1]
                last = last.masked_fill(last < kth, float("-inf"))
            probs = torch.softmax(last, -1).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        seq.append(nxt)
        if stop_id is not None and nxt == stop_id:
            break
    return seq


@torch.no_grad()
def speculative_replay(model, seq, prompt_len, device):
    """Replays greedy self-speculative decoding (one MTP draft per step) over a greedy
    sequence: returns (drafts, accepted)."""
    s = torch.tensor([seq], device=device)
    _, h = model(s)
    drafts = model.mtp_forward(h[:, :-1], s[:, 1:]).argmax(-1)[0].tolist()
    j, made, ok = prompt_len - 1, 0, 0
    while j + 2 < len(seq):
        made += 1
        if drafts[j] == seq[j + 2]:
            ok += 1
            j += 2
        else:
            j += 1
    return made, ok


@torch.no_grad()
def reference_fixture(model, prompts, path, metadata):
    """Writes the reference-logits safetensors file for `prompts` [(text, ids)]."""
    tensors = {}
    min_margin = {"expert": float("inf"), "group": float("inf")}
    moes = model.moe_layers()
    hooks = []
    captured = {}

    def capture(index):
        def hook(module, inputs, output):
            captured[index] = inputs[0].detach().reshape(-1, inputs[0].shape[-1])
        return hook

    for index, moe in moes.items():
        hooks.append(moe.register_forward_hook(capture(index)))
    cfg = model.cfg
    try:
        for p, (text, ids) in enumerate(prompts):
            x = torch.tensor([ids])
            logits, h = model(x)
            layer_topk = {i: moe.last_topk for i, moe in moes.items()
                          if i < cfg.num_hidden_layers}
            mtp_logits = model.mtp_forward(h[:, :-1], x[:, 1:])
            for i, moe in moes.items():
                if i >= cfg.num_hidden_layers:
                    layer_topk[i] = moe.last_topk
                flat = captured[i]
                scores = torch.sigmoid(F.linear(flat, moe.gate.weight))
                choice = scores + moe.gate.e_score_correction_bias
                per = cfg.n_routed_experts // cfg.n_group
                gs = choice.view(-1, cfg.n_group, per).topk(2, -1).values.sum(-1)
                gs_sorted = gs.sort(-1, descending=True).values
                if cfg.topk_group < cfg.n_group:
                    gap = (gs_sorted[:, cfg.topk_group - 1] - gs_sorted[:, cfg.topk_group]).min()
                    min_margin["group"] = min(min_margin["group"], gap.item())
                ids_k, _ = layer_topk[i]
                groups = gs.topk(cfg.topk_group, -1).indices
                eligible = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, groups, True)
                eligible = eligible.unsqueeze(-1).expand(-1, cfg.n_group, per).reshape(
                    flat.shape[0], -1)
                cs = choice.masked_fill(~eligible, float("-inf")).sort(-1, descending=True).values
                k = cfg.num_experts_per_tok
                if k < cfg.topk_group * per:
                    gap = (cs[:, k - 1] - cs[:, k]).min()
                    min_margin["expert"] = min(min_margin["expert"], gap.item())
            tensors[f"prompts.{p}.input_ids"] = x[0].to(torch.int32)
            tensors[f"prompts.{p}.logits"] = logits[0].float().contiguous()
            tensors[f"prompts.{p}.mtp_logits"] = mtp_logits[0].float().contiguous()
            for i in sorted(layer_topk):
                ids_k, w_k = layer_topk[i]
                order = ids_k.argsort(-1)
                tensors[f"prompts.{p}.layers.{i}.expert_ids"] = (
                    ids_k.gather(1, order).to(torch.int32).contiguous())
                tensors[f"prompts.{p}.layers.{i}.expert_weights"] = (
                    w_k.gather(1, order).float().contiguous())
            metadata[f"prompts.{p}.text"] = text
    finally:
        for hk in hooks:
            hk.remove()
    metadata["prompt_count"] = len(prompts)
    metadata["min_expert_selection_margin"] = f"{min_margin['expert']:.6g}"
    metadata["min_group_selection_margin"] = f"{min_margin['group']:.6g}"
    safetensors_file.write(path, tensors, metadata)
    return min_margin
