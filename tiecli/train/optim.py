# Used by `tiecli train` (and the dry-run's timing): the optimizer and its learning-rate schedule.
"""AdamW with per-group weight decay and learning-rate scale; linear warmup then cosine decay."""

import math

import torch

from tiecli.config.schema import Config, TrainConfig
from tiecli.model.gpt import GPT


def make_optimizer(model: GPT, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; matrices decay, biases and LayerNorm gains never do, embeddings as train.decay_embeddings says.

    A group per (decay, lr_scale), decayed groups first; lr_scale is the group's learning rate over
    train.lr (see lr_scale), which the loop multiplies into the schedule. With the defaults: two groups.
    """
    groups: dict[tuple[bool, float], list] = {}
    for name, p in model.named_parameters():  # a tied matrix appears once: no duplicate in the groups
        is_embedding = name.startswith(("emb.", "wpe."))
        decay = p.dim() >= 2 and (t.decay_embeddings or not is_embedding)
        groups.setdefault((decay, lr_scale(model, name, t)), []).append(p)
    ordered = sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1]))
    param_groups = [
        {"params": params, "weight_decay": t.weight_decay if decay else 0.0, "lr_scale": scale}
        for (decay, scale), params in ordered
    ]
    return torch.optim.AdamW(param_groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type in ("cuda", "cpu"))


def lr_scale(model: GPT, name: str, t: TrainConfig) -> float:
    """A parameter's peak learning rate over train.lr, as nanochat gives its token matrices their own.

    The input embedding trains at train.lr_embedding, and so does a matrix shared by both sides
    (it is the input embedding too); the output side's own parameters at train.lr_output; the rest,
    positions included, at train.lr.
    """
    if not name.startswith("emb."):
        return 1.0
    role = model.emb.roles[name.removeprefix("emb.")]
    lr = t.lr_output if role == "output" else t.lr_embedding
    return 1.0 if lr is None else lr / t.lr


def lr_at(step: int, c: Config) -> float:
    """Linear warmup to train.lr over Config.warmup steps, then cosine decay to min_lr at max_steps."""
    t, warmup = c.train, c.warmup
    if step < warmup:
        return t.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, c.max_steps - warmup)
    return t.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (t.lr - t.min_lr)


def untie_step(c: Config) -> int | None:
    """tied_then_untied: how many steps train the one matrix, round(untie_at x max_steps), before it is two; else None.

    A fraction, as the schedule's warmup is: a resume that extends max_steps before the switch moves
    it with the schedule; after it the model stays untied (the phase is in its weights)."""
    return round(c.model.untie_at * c.max_steps) if c.model.tying == "tied_then_untied" else None


@torch.no_grad()
def untie(model: GPT, optimizer: torch.optim.AdamW) -> None:
    """The switch of tied_then_untied, as modded-nanogpt makes it: lm_head becomes a copy of the shared
    matrix, and its AdamW state (exp_avg, exp_avg_sq, step) a copy of the shared matrix's, so both
    matrices continue the shared one's moments rather than restarting AdamW's bias correction."""
    emb = model.emb
    emb.untie()
    shared = optimizer.state.get(emb.wte)
    if shared:  # none before the first step (untie_at=0)
        optimizer.state[emb.lm_head] = {k: v.clone() for k, v in shared.items()}
