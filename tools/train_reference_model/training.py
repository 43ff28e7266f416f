"""The training loop: next-token loss + lambda * MTP loss + the sequence-wise balance loss,
AdamW, warmup then cosine decay, and after every step the auxiliary-loss-free bias update
of DeepSeek-V3 (report §2.1.2): for each MoE layer, with load_i the number of tokens of the
step routed to expert i, e_score_correction_bias_i += gamma * sign(mean(load) - load_i).
"""

import dataclasses
import math
import time

import numpy as np
import torch
import torch.nn.functional as F


@dataclasses.dataclass
class TrainOptions:
    steps: int
    batch_size: int
    seq_len: int
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_weight: float = 0.3          # lambda of the MTP loss
    bias_update_speed: float = 0.001  # gamma of the balancing rule
    seed: int = 0
    log_every: int = 50


def learning_rate(opts, step):
    if step < opts.warmup_steps:
        return opts.lr * (step + 1) / opts.warmup_steps
    progress = (step - opts.warmup_steps) / max(1, opts.steps - opts.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return opts.lr * (opts.min_lr_ratio + (1 - opts.min_lr_ratio) * cosine)


def _optimizer(model, opts):
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": opts.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=opts.lr, betas=(0.9, 0.95), eps=1e-8)


def losses(model, batch):
    """batch [B, T+1] -> (main loss, MTP loss, balance loss) for positions 0..T-1."""
    v = model.cfg.vocab_size
    x = batch[:, :-1]
    logits, h = model(x)
    main = F.cross_entropy(logits.reshape(-1, v), batch[:, 1:].reshape(-1))
    # MTP position i: h[i] and t[i+1] predict t[i+2].
    mtp_logits = model.mtp_forward(h[:, :-1], batch[:, 1:-1])
    mtp = F.cross_entropy(mtp_logits.reshape(-1, v), batch[:, 2:].reshape(-1))
    balance = sum((m.last_balance_loss for m in model.moe_layers().values()
                   if m.last_balance_loss is not None), torch.zeros((), device=batch.device))
    return main, mtp, balance


@torch.no_grad()
def update_balance_bias(model, gamma):
    for moe in model.moe_layers().values():
        load = moe.last_load
        moe.gate.e_score_correction_bias += gamma * torch.sign(load.mean() - load)


def train(model, stream, opts, device, log=print, on_step=None):
    """Trains on random windows of the token stream (numpy uint16); returns a summary.
    on_step(step) runs after each step (step counts from 1)."""
    rng = np.random.default_rng(opts.seed)
    optimizer = _optimizer(model, opts)
    model.train()
    curve = []
    window = opts.seq_len + 1
    if len(stream) <= window:
        raise ValueError(f"training stream has {len(stream)} tokens, fewer than one window")
    start_wall, start_cpu = time.time(), time.process_time()
    acc = {"loss": 0.0, "mtp": 0.0, "n": 0, "imbalance": 0.0}
    for step in range(opts.steps):
        offsets = rng.integers(0, len(stream) - window, size=opts.batch_size)
        batch = np.stack([stream[o:o + window] for o in offsets]).astype(np.int64)
        batch = torch.from_numpy(batch).to(device)
        lr = learning_rate(opts, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        main, mtp, balance = losses(model, batch)
        loss = main + opts.mtp_weight * mtp + balance
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
        optimizer.step()
        update_balance_bias(model, opts.bias_update_speed)
        if on_step:
            on_step(step + 1)
        loads = [m.last_load for m in model.moe_layers().values()]
        acc["loss"] += main.item()
        acc["mtp"] += mtp.item()
        acc["imbalance"] += sum((l.max() / l.mean()).item() for l in loads) / len(loads)
        acc["n"] += 1
        if (step + 1) % opts.log_every == 0 or step + 1 == opts.steps:
            n = acc["n"]
            elapsed = time.time() - start_wall
            row = {"step": step + 1, "loss": round(acc["loss"] / n, 4),
                   "mtp_loss": round(acc["mtp"] / n, 4), "lr": lr,
                   "max_over_mean_load": round(acc["imbalance"] / n, 3),
                   "seconds": round(elapsed, 1)}
            curve.append(row)
            log(f"step {row['step']}/{opts.steps} loss {row['loss']:.4f} mtp {row['mtp_loss']:.4f} "
                f"lr {lr:.2e} load max/mean {row['max_over_mean_load']:.2f} "
                f"{elapsed / (step + 1):.3f} s/step")
            acc = {"loss": 0.0, "mtp": 0.0, "n": 0, "imbalance": 0.0}
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.time() - start_wall, time.process_time() - start_cpu
    model.eval()
    return {"seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
            "seconds_per_step": round(wall / opts.steps, 4),
            "tokens_seen": opts.steps * opts.batch_size * opts.seq_len, "curve": curve}
