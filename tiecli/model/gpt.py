# Used by `tiecli train`, `tiecli eval` and `tiecli info`; imports only torch, GPTConfig and tiecli/model/head.py.
"""A GPT-2 style language model whose input embedding and output matrix are tied, or not.

Everything about tying lives in `Embeddings`: one branch per mode, each building its own
parameters, and two methods that give the effective (V, C) input and output matrices. The
transformer body is nanoGPT's: pre-LayerNorm blocks, causal self-attention through SDPA,
a 4x GELU MLP, learned positions (and, with embedding_norm, an RMSNorm before the first block).
The file reads top down: blocks, the tied or untied token matrices, GPT; the loss goes through
the fused head, and a shared matrix through the gradient fork, both in tiecli/model/head.py. The config,
GPTConfig, lives with the rest of the config's shape in tiecli/config/schema.py, so that the
config layer never reaches up to the model.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tiecli.config.schema import GPTConfig
from tiecli.model.head import Fork, linear_cross_entropy

INIT_STD = 0.02  # GPT-2's normal init of every matrix


class KVCache:
    """Each layer's keys and values of the positions seen so far, for generating one token at a time.

    With it a new token costs one position through the model instead of the whole context. Learned
    positions make it valid only while the context fits block_size: past that, the window slides,
    every token's position changes, and the keys must be computed again (see tiecli/commands/sample.py).
    Buffers are made on the first update, in the dtype and device of the keys.
    """

    def __init__(self, config: GPTConfig):
        self.block_size = config.block_size
        self.keys: list[torch.Tensor | None] = [None] * config.n_layer  # (B, nh, block_size, hs) each
        self.values: list[torch.Tensor | None] = [None] * config.n_layer
        self.length = 0  # positions held; GPT.forward advances it after every layer has stored its part

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' k and v (B, nh, T, hs); return every position's so far (B, nh, length + T, hs)."""
        B, nh, T, hs = k.shape
        if self.keys[layer] is None:
            self.keys[layer] = k.new_zeros(B, nh, self.block_size, hs)
            self.values[layer] = v.new_zeros(B, nh, self.block_size, hs)
        keys, values = self.keys[layer], self.values[layer]
        assert keys is not None and values is not None
        end = self.length + T
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        return keys[:, :, :end], values[:, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if cache is None:
            dropout = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)  # (B, nh, T, hs)
        else:
            start = cache.length
            k, v = cache.update(layer, k, v)  # (B, nh, start + T, hs): the cached positions, then these
            # The query at position start + i sees the keys at positions 0 .. start + i.
            mask = torch.arange(start + T, device=x.device) <= torch.arange(start, start + T, device=x.device)[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
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

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


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
      tied_then_untied     wte (V, C) shared until untie(), then input; lm_head (V, C) idle until untie()
                           copies wte into it, then output. The buffer `untied` records the phase
    `roles` maps each parameter name to "input", "output" or "shared"; tied_then_untied's are those
    of the untied model it becomes (its counts and learning rates; wte trains at the input
    embedding's rate in both phases), and `shared` says which phase it is in.

    A shared matrix reaches its two sides through `Fork`, whose backward also leaves each side's
    gradient in a sink, so the one backward pass that trains the model yields the input-path and
    output-path gradients separately (`split_grads`); they sum to wte.grad. The fork is always
    there, so the autograd graph, hence every number and every compiled graph, is the same with
    the diagnostics on or off.

    The matrices are drawn from `generator` (the global RNG when None) in the order declared, wte
    first, so for one generator seed untied, untied_init, tied, tied_bias, hybrid and tied_then_untied
    all start from the same wte (scaled draws it with its own std, partial narrower, and embedding_std
    scales it).
    """

    def __init__(self, config: GPTConfig, generator: torch.Generator | None = None):
        super().__init__()
        V, C = config.vocab_size, config.n_embd
        self.mode = config.tying
        self.init_std = token_init_std(config)
        # untied, tied_then_untied: the field's own inits (docs/configuration.md); None keeps init_std
        self.embedding_std = config.embedding_std if config.embedding_std is not None else self.init_std
        self.output_std = config.output_std if config.output_std is not None else self.init_std
        # tied_then_untied before untie(): the `untied` buffer's mirror, a Python bool that compile guards on
        self.untie_pending = self.mode == "tied_then_untied"
        self.input_scale = 1.0
        self.logit_scale = 1.0
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
        elif self.mode == "tied_then_untied":
            self.wte = _empty(V, C)
            self.lm_head = _empty(V, C)
            self.roles = {"wte": "input", "lm_head": "output"}
            # In the state dict, so a checkpoint, init.pt and every snapshot say which phase they hold.
            self.register_buffer("untied", torch.tensor(False))
            self.register_load_state_dict_post_hook(lambda module, _: module._read_phase())
        self.reset_parameters(generator)
        self._make_sinks()

    def _make_sinks(self) -> None:
        """Two leaves shaped like wte that receive the input- and output-path gradients (shared modes).

        Expanded zeros: no memory of their own, only their .grad. Not parameters: no optimizer,
        state_dict or gradient norm sees them. Remade after .to() (see _apply), which would
        otherwise turn a leaf into a copy with a history.
        """
        self.sinks: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.shared or self.mode == "tied_then_untied":  # its untied phase leaves them unused
            zero = torch.zeros((), dtype=self.wte.dtype, device=self.wte.device)
            self.sinks = tuple(zero.expand(self.wte.shape).requires_grad_() for _ in range(2))  # type: ignore[assignment]

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._make_sinks()
        return self

    def _read_phase(self) -> None:
        self.untie_pending = not bool(self.untied)

    @torch.no_grad()
    def untie(self) -> None:
        """tied_then_untied: from now on wte is the input embedding and lm_head, a copy of it, the output
        matrix. Both start equal, so the logits and loss do not change at the switch; only the gradients
        stop summing. The optimizer's state goes with it (tiecli/train/optim.py:untie)."""
        assert self.untie_pending
        self.lm_head.copy_(self.wte)
        self.get_buffer("untied").fill_(True)
        self.untie_pending = False

    def split_grads(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(G_in, G_out) of a shared wte, summed over the backward passes since clear_split_grads; else None."""
        if not self.shared or self.sinks is None or self.sinks[0].grad is None or self.sinks[1].grad is None:
            return None
        return self.sinks[0].grad, self.sinks[1].grad

    def clear_split_grads(self) -> None:
        for sink in self.sinks or ():
            sink.grad = None

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) in declaration order, from `generator` (the global RNG when None)."""
        std = {"wte": self.embedding_std, "lm_head": self.output_std}
        for name, p in self.named_parameters():
            # lm_u starts at zero so hybrid's W_out starts equal to W_in, as a LoRA adapter starts at the base.
            # tied_then_untied's lm_head is idle until untie() overwrites it: zeros, no draw.
            if name in ZERO_INIT or (self.mode == "tied_then_untied" and name == "lm_head"):
                p.zero_()
            else:
                p.normal_(0.0, std.get(name, self.init_std), generator=generator)
        if self.mode == "untied_init":
            # Same starting point as tied, but free to move apart from step one.
            self.lm_head.copy_(self.wte)

    @property
    def shared(self) -> bool:
        """Whether some parameter feeds both the input and the output side (now: tied_then_untied's phase)."""
        return self.untie_pending or "shared" in self.roles.values()

    @property
    def one_matrix(self) -> bool:
        """Whether the effective input and output matrices are one tensor (scales and bias aside)."""
        return self.mode in ("tied", "tied_bias", "scaled") or self.untie_pending

    def _sides(self) -> tuple[torch.Tensor, torch.Tensor]:
        """wte as the input side and as the output side use it: through the fork when shared."""
        if self.sinks is None or not self.shared:
            return self.wte, self.wte
        return Fork.apply(self.wte, *self.sinks)

    def _input_matrix(self, w_in: torch.Tensor) -> torch.Tensor:
        return torch.cat([w_in, self.wte_own], dim=1) if self.mode == "partial" else w_in

    def _output_matrix(self, w_out: torch.Tensor) -> torch.Tensor:
        if self.mode in ("untied", "untied_init", "tied_then_untied") and not self.untie_pending:
            return self.lm_head
        if self.mode == "partial":
            return torch.cat([w_out, self.lm_head_own], dim=1)
        if self.mode == "hybrid":
            return w_out + self.lm_u @ self.lm_v
        return w_out

    def input_matrix(self) -> torch.Tensor:
        """The effective (V, C) input embedding, scale excluded."""
        return self._input_matrix(self.wte)

    def output_matrix(self) -> torch.Tensor:
        """The effective (V, C) output matrix: logits = h @ output_matrix().T (scale, bias excluded)."""
        return self._output_matrix(self.wte)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The input embeddings (B, T, C) of idx and the head: the (V, C) output matrix and the bias.

        One call, so that a shared wte goes through one fork, whose sinks then hold both sides.
        """
        w_in, w_out = self._sides()
        if self.mode == "partial":  # look up both column blocks: no (V, C) concatenation for the input
            x = torch.cat([F.embedding(idx, w_in), F.embedding(idx, self.wte_own)], dim=-1)  # (B, T, C)
        else:
            x = F.embedding(idx, w_in)  # (B, T, C)
        x = x * self.input_scale if self.input_scale != 1.0 else x
        return x, self._output_matrix(w_out), self.lm_bias if self.mode == "tied_bias" else None

    def encode(self, idx: torch.Tensor) -> torch.Tensor:
        """The input embeddings (B, T, C) alone."""
        return self(idx)[0]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Full logits (B, T, V) of final hidden states x, for sampling and inspection; training uses the fused head."""
        return self.logits(x, self.output_matrix(), self.lm_bias if self.mode == "tied_bias" else None)

    def logits(self, x: torch.Tensor, w_out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        logits = F.linear(x, w_out)  # (B, T, V)
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        return logits if bias is None else logits + bias


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

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
        cache: KVCache | None = None,
    ):
        """Logits (B, T, V); with targets, the cross-entropy instead: a scalar, or (B, T) for reduction="none".

        With a cache (generation), idx continues the cached positions, and the cache keeps its keys and values.
        """
        B, T = idx.shape
        start = 0 if cache is None else cache.length
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size={self.config.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        tok, w_out, bias = self.emb(idx)  # (B, T, C), (V, C), (V,) or None
        x = tok + self.wpe(pos)  # (B, T, C)
        if self.config.embedding_norm:
            # The recipes' norm after the embedding (modded-nanogpt, nanochat): RMSNorm without a gain,
            # so it adds no parameter. On the sum, since those recipes add no positions (rotary):
            # normalising the token rows alone would put them at RMS 1 over positions at std 0.02.
            x = F.rms_norm(x, (x.size(-1),))
        x = self.drop(x)
        for layer, block in enumerate(self.h):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += T
        x = self.ln_f(x)
        if targets is None:
            return self.emb.logits(x, w_out, bias)  # (B, T, V)
        # The fused head: never the (B*T, V) logits; its softmax in fp32 even under bf16 autocast.
        loss = linear_cross_entropy(
            x.flatten(0, 1), w_out, targets.flatten(), bias, self.emb.logit_scale, reduction=reduction
        )
        return loss if reduction != "none" else loss.view(B, T)

    def param_counts(self) -> dict[str, int]:
        """Parameters split into input embedding, output matrix, shared, positional, non-embedding, total.

        Each tensor counts once, so a tied matrix counts once, under "shared". tied_then_untied counts
        the model it ends as (two matrices) and adds tied_phase_total, what it trains before untie().
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
        if self.emb.mode == "tied_then_untied":  # the counts above are the untied phase's; before it lm_head is idle
            counts["tied_phase_total"] = counts["total"] - self.emb.lm_head.numel()
        return counts


def count_params(config: GPTConfig) -> dict[str, int]:
    """GPT.param_counts() without allocating: the model is built on the meta device."""
    with torch.device("meta"):
        return GPT(config).param_counts()
