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


INIT_STD = 0.02  # GPT-2's normal init of every matrix
ZERO_INIT = ("lm_bias", "lm_u")  # token parameters that start at zero (see Embeddings)


def _empty(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


def token_init_std(config: GPTConfig) -> float:
    """The std of the token matrices' normal init: GPT-2's 0.02, unless `scaled` borrows a scale.

    A scale borrowed without its origin's init is half a recipe. T5 multiplies the logits by
    1/sqrt(C) and draws its embedding with std 1.0, so logits h . w / sqrt(C) start at std ~1 (h is
    LayerNorm's output, ~1 per dimension); with 0.02 they would start 50 times smaller. Gemma
    multiplies the inputs by sqrt(C); its published (inference) code draws the table from a
    placeholder normal(0.01) and its training init is not published, so we take std 1/sqrt(C): the
    scaled input rows then have std 1, the scale of the normalised residual stream, which is what
    the sqrt(C) exists to restore (1.0 would make them sqrt(C) and drown the positions). With both
    scales the inputs decide, since an input sqrt(C) too large does more harm than logits that
    start at std 1/sqrt(C).
    """
    if config.tying != "scaled":
        return INIT_STD
    if config.scale_inputs:
        return config.n_embd**-0.5
    return 1.0 if config.scale_logits else INIT_STD


def _seeded_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Two independent streams from one seed: the transformer body's and the token matrices'.

    Apart, a same-seed pair of tying modes differs only in its token matrices: the body's draws do
    not wait for however many numbers a mode's token matrices take. device="cpu": the seeds must be
    numbers even when the model is built on the meta device.
    """
    root = torch.Generator().manual_seed(seed)
    body, tokens = torch.randint(2**62, (2,), generator=root, device="cpu").tolist()
    return torch.Generator().manual_seed(body), torch.Generator().manual_seed(tokens)


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

    The matrices are drawn from `generator` (the global RNG when None) in the order declared, wte
    first, so for one generator seed untied, untied_init, tied, tied_bias and hybrid all start from
    the same wte (scaled draws it with its own std, partial narrower).
    """

    def __init__(self, config: GPTConfig, generator: torch.Generator | None = None):
        super().__init__()
        V, C = config.vocab_size, config.n_embd
        self.mode = config.tying
        self.init_std = token_init_std(config)
        self.input_scale = 1.0
        self.logit_scale = 1.0
        self.record_grads = False
        self.grads: dict[str, torch.Tensor] = {}
        if self.mode in ("untied", "untied_init"):
            self.wte = _empty(V, C)
            self.lm_head = _empty(V, C)
            self.roles = {"wte": "input", "lm_head": "output"}
        elif self.mode == "tied":
            self.wte = _empty(V, C)
            self.roles = {"wte": "shared"}
        elif self.mode == "tied_bias":
            self.wte = _empty(V, C)
            self.lm_bias = _empty(V)
            self.roles = {"wte": "shared", "lm_bias": "output"}
        elif self.mode == "scaled":
            self.wte = _empty(V, C)
            self.input_scale = math.sqrt(C) if config.scale_inputs else 1.0
            self.logit_scale = 1 / math.sqrt(C) if config.scale_logits else 1.0
            self.roles = {"wte": "shared"}
        elif self.mode == "partial":
            k = config.n_shared
            self.wte = _empty(V, k)
            self.wte_own = _empty(V, C - k)
            self.lm_head_own = _empty(V, C - k)
            self.roles = {"wte": "shared", "wte_own": "input", "lm_head_own": "output"}
        elif self.mode == "hybrid":
            self.wte = _empty(V, C)
            self.lm_u = _empty(V, config.rank)
            self.lm_v = _empty(config.rank, C)
            self.roles = {"wte": "shared", "lm_u": "output", "lm_v": "output"}
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) in declaration order, from `generator` (the global RNG when None)."""
        for name, p in self.named_parameters():
            # lm_u starts at zero so hybrid's W_out starts equal to W_in, as a LoRA adapter starts at the base.
            if name in ZERO_INIT:
                p.zero_()
            else:
                p.normal_(0.0, self.init_std, generator=generator)
        if self.mode == "untied_init":
            # Same starting point as tied, but free to move apart from step one.
            self.lm_head.copy_(self.wte)

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
    """The language model. `seed` alone decides the initial weights, whatever state the global RNG is in.

    The body (positions, blocks, final LayerNorm) and the token matrices draw from two generators
    derived from the seed, so every tying mode gets the same body for the same seed.
    """

    def __init__(self, config: GPTConfig, seed: int = 0):
        super().__init__()
        self.config = config
        body, tokens = _seeded_generators(seed)
        self.emb = Embeddings(config, tokens)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self._init_body(body)

    @torch.no_grad()
    def _init_body(self, generator: torch.Generator) -> None:
        """GPT-2's init: N(0, 0.02) matrices, zero biases, LayerNorm gains at one (as constructed)."""
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):  # the token matrices are Parameters, not these
                # GPT-2: residual projections get 1/sqrt(2 * n_layer), so the residual stream's
                # variance does not grow with depth.
                std = INIT_STD / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj") else INIT_STD
                module.weight.normal_(0.0, std, generator=generator)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    bias.zero_()

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
        counts["non_embedding"] = sum(
            p.numel() for n, p in self.named_parameters() if not n.startswith(("emb.", "wpe."))
        )
        counts["total"] = sum(p.numel() for p in self.parameters())
        return counts


def count_params(config: GPTConfig) -> dict[str, int]:
    """GPT.param_counts() without allocating: the model is built on the meta device."""
    with torch.device("meta"):
        return GPT(config).param_counts()
