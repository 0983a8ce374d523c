# Used by `tiecli train`, `tiecli eval` and `tiecli info`; imports only torch.
"""A GPT-2 style language model whose input embedding and output matrix are tied, or not.

Everything about tying lives in `Embeddings`: one branch per mode, each building its own
parameters, and two methods that give the effective (V, C) input and output matrices. The
transformer body is nanoGPT's: pre-LayerNorm blocks, causal self-attention through SDPA,
a 4x GELU MLP, learned positions.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

TYING_MODES = ("untied", "tied", "tied_bias", "scaled", "partial", "hybrid", "untied_init")


@dataclass
class GPTConfig:
    """The model's shape and tying mode.

    The sizes have no defaults: conf/ holds them, and tiecli/config.py fills every field from there.
    The rest default to nanoGPT's choices (no dropout, biases, tied) and, for the settings that only
    some modes have, to stand-ins for the other modes (conf/ gives each mode only its own settings).
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, as GPT-2
    tying: str = "tied"  # one of TYING_MODES
    scale_logits: bool = False  # scaled: logits * n_embd**-0.5 (T5)
    scale_inputs: bool = False  # scaled: input embeddings * n_embd**0.5 (Gemma)
    shared_fraction: float = 0.5  # partial: fraction of the n_embd dimensions both sides share
    rank: int = 16  # hybrid: rank of the output matrix's independent part

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):  # first: n_head=0 would divide by zero
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.tying not in TYING_MODES:
            raise ValueError(f"tying mode {self.tying!r} is not one of {', '.join(TYING_MODES)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} is not in [0, 1)")
        # Only the mode that uses a setting checks it: the stand-in rank=16 must not refuse a tied model 8 wide.
        if self.tying == "partial" and not 0.0 <= self.shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction={self.shared_fraction} is not in [0, 1]")
        if self.tying == "hybrid" and not 1 <= self.rank <= self.n_embd:
            raise ValueError(f"rank={self.rank} is not in [1, n_embd={self.n_embd}]")

    @property
    def n_shared(self) -> int:
        """partial: how many embedding dimensions input and output share."""
        return round(self.shared_fraction * self.n_embd)


def _normal(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * 0.02)


class Embeddings(nn.Module):
    """The input embedding and the output (unembedding) matrix, tied or not.

    Parameters by mode (V = vocab_size, C = n_embd, k = n_shared, r = rank):
      untied, untied_init  wte (V, C) input, lm_head (V, C) output
      tied                 wte (V, C) shared
      tied_bias            wte (V, C) shared, lm_bias (V,) output
      scaled               wte (V, C) shared, with constant scales on either side
      partial              wte (V, k) shared, wte_own (V, C-k) input, lm_head_own (V, C-k) output
      hybrid               wte (V, C) shared, lm_u (V, r) and lm_v (r, C) output: W_out = wte + lm_u @ lm_v
    `roles` maps each parameter name to "input", "output" or "shared".

    Each use of a shared matrix goes through its own view. When `record_grads` is on, a hook on
    each view keeps its gradient, so the one backward pass that trains the model also yields the
    input-path and output-path gradients separately in `grads` ("in", "out"); they sum to wte.grad.
    The views are always there (they cost nothing), so the autograd graph and hence every number
    is the same with the diagnostics on or off.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        V, C = config.vocab_size, config.n_embd
        self.mode = config.tying
        self.input_scale = 1.0
        self.logit_scale = 1.0
        self.record_grads = False
        self.grads: dict[str, torch.Tensor] = {}
        if self.mode in ("untied", "untied_init"):
            self.wte = _normal(V, C)
            self.lm_head = _normal(V, C)
            if self.mode == "untied_init":
                # Same starting point as tied, but free to move apart from step one.
                self.lm_head.data.copy_(self.wte.data)
            self.roles = {"wte": "input", "lm_head": "output"}
        elif self.mode == "tied":
            self.wte = _normal(V, C)
            self.roles = {"wte": "shared"}
        elif self.mode == "tied_bias":
            self.wte = _normal(V, C)
            self.lm_bias = nn.Parameter(torch.zeros(V))
            self.roles = {"wte": "shared", "lm_bias": "output"}
        elif self.mode == "scaled":
            self.wte = _normal(V, C)
            self.input_scale = math.sqrt(C) if config.scale_inputs else 1.0
            self.logit_scale = 1 / math.sqrt(C) if config.scale_logits else 1.0
            self.roles = {"wte": "shared"}
        elif self.mode == "partial":
            k = config.n_shared
            self.wte = _normal(V, k)
            self.wte_own = _normal(V, C - k)
            self.lm_head_own = _normal(V, C - k)
            self.roles = {"wte": "shared", "wte_own": "input", "lm_head_own": "output"}
        elif self.mode == "hybrid":
            self.wte = _normal(V, C)
            # lm_u starts at zero so W_out starts equal to W_in, as a LoRA adapter starts at the base.
            self.lm_u = nn.Parameter(torch.zeros(V, config.rank))
            self.lm_v = _normal(config.rank, C)
            self.roles = {"wte": "shared", "lm_u": "output", "lm_v": "output"}

    @property
    def shared(self) -> bool:
        """Whether some parameter feeds both the input and the output side."""
        return "shared" in self.roles.values()

    @property
    def one_matrix(self) -> bool:
        """Whether the effective input and output matrices are one tensor (scales and bias aside)."""
        return self.mode in ("tied", "tied_bias", "scaled")

    def _wte(self, side: str) -> torch.Tensor:
        """wte as used on one side ("in" or "out"): a view of it, hooked while gradients are recorded."""
        if not self.shared:
            return self.wte
        view = self.wte.view_as(self.wte)
        if not (self.record_grads and view.requires_grad):
            return view

        def keep(grad: torch.Tensor) -> None:
            # Summed over the micro-batches of one optimizer step, like wte.grad itself.
            self.grads[side] = self.grads[side] + grad if side in self.grads else grad

        view.register_hook(keep)
        return view

    def input_matrix(self) -> torch.Tensor:
        """The effective (V, C) input embedding, scale excluded."""
        if self.mode == "partial":
            return torch.cat([self._wte("in"), self.wte_own], dim=1)
        return self._wte("in")

    def output_matrix(self) -> torch.Tensor:
        """The effective (V, C) output matrix: logits = h @ output_matrix().T (scale, bias excluded)."""
        if self.mode in ("untied", "untied_init"):
            return self.lm_head
        if self.mode == "partial":
            return torch.cat([self._wte("out"), self.lm_head_own], dim=1)
        if self.mode == "hybrid":
            return self._wte("out") + self.lm_u @ self.lm_v
        return self._wte("out")

    def encode(self, idx: torch.Tensor) -> torch.Tensor:
        if self.mode == "partial":  # look up both column blocks: no (V, C) concatenation per step
            x = torch.cat([F.embedding(idx, self._wte("in")), F.embedding(idx, self.wte_own)], dim=-1)  # (B, T, C)
        else:
            x = F.embedding(idx, self.input_matrix())  # (B, T, C)
        return x * self.input_scale if self.input_scale != 1.0 else x

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.output_matrix())  # (B, T, V)
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.mode == "tied_bias":
            logits = logits + self.lm_bias
        return logits


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.emb = Embeddings(config)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            if name.endswith("c_proj"):
                # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) so the residual stream's
                # variance does not grow with depth.
                nn.init.normal_(module.weight, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, reduction: str = "mean"):
        """Logits (B, T, V); with targets, the cross-entropy instead: a scalar, or (B, T) for reduction="none"."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size={self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.emb.encode(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.emb.decode(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        # The loss in fp32 even under bf16 autocast: a softmax over V terms needs the precision.
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)
        return loss if reduction == "mean" else loss.view(B, T)

    def param_counts(self) -> dict[str, int]:
        """Parameters split into input embedding, output matrix, shared, positional, non-embedding, total.

        Each tensor counts once, so a tied matrix counts once, under "shared".
        """
        counts = {"input_embedding": 0, "output_matrix": 0, "shared": 0}
        role_key = {"input": "input_embedding", "output": "output_matrix", "shared": "shared"}
        for name, p in self.emb.named_parameters():
            counts[role_key[self.emb.roles[name]]] += p.numel()
        counts["positional"] = self.wpe.weight.numel()
        counts["non_embedding"] = sum(p.numel() for n, p in self.named_parameters() if not n.startswith(("emb.", "wpe.")))
        counts["total"] = sum(p.numel() for p in self.parameters())
        return counts


def count_params(config: GPTConfig) -> dict[str, int]:
    """GPT.param_counts() without allocating: the model is built on the meta device."""
    with torch.device("meta"):
        return GPT(config).param_counts()
