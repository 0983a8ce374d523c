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

    The sizes have no defaults: conf/ holds them, and tiecli/config/checks.py fills every field from there.
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
HEAD_CHUNK_ELEMENTS = 2**22  # on a CPU the fused head holds about this many logits (16 MB in fp32) at a time,
HEAD_CHUNK_MIN_ROWS = 512  # but at least this many rows: thinner matmuls run far below the peak (docs/performance.md)
# A GPU's chunk is sized by its memory, not by a cache: 2**27 fp32 logits (512 MiB, 2,668 rows at
# V = 50,304) keep a 16k-token micro-batch within HEAD_GRAPH_MAX_CHUNKS chunks, inside the compiled
# graph, and a few such buffers fit the smallest GPU worth training on (16 GB).
HEAD_CHUNK_ELEMENTS_CUDA = 2**27
# The head's matmuls see the vocabulary padded with zero rows to a multiple of this, per device type
# (nanoGPT's 50,257 -> 50,304 for GPT-2: tensor-core tiles fit it); the padding is masked out of the
# softmax, so loss and gradients are those of the unpadded head. Not on a CPU, where it buys nothing
# and costs a copy of the matrix a step.
HEAD_PAD = {"cuda": 64}


def chunk_elements(device_type: str) -> int:
    """Logits the fused head holds at a time on this device type (see HEAD_CHUNK_ELEMENTS_CUDA)."""
    return HEAD_CHUNK_ELEMENTS_CUDA if device_type == "cuda" else HEAD_CHUNK_ELEMENTS


def _padded(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """(V, ...) -> (V', ...): zero rows appended up to a multiple of `multiple` (V' = V when it is one)."""
    extra = -t.shape[0] % multiple
    return t if extra == 0 else torch.cat([t, t.new_zeros(extra, *t.shape[1:])])


def _head_dtype(h: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmuls' dtype: autocast's (bf16) when it is on for h's device, else the weight's."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return weight.dtype


def _chunk_logits(h, w, bias, scale: float, n_valid: int) -> torch.Tensor:
    """fp32 logits (n, V) of one chunk of rows: the matmul in the compute dtype, everything after in fp32.

    Columns from n_valid on are the head's padding (HEAD_PAD): -inf, so the softmax gives them nothing."""
    logits = (h @ w.t()).float()
    if scale != 1.0:
        logits = logits * scale
    logits = logits if bias is None else logits + bias.float()
    if n_valid < logits.shape[1]:
        logits[:, n_valid:] = float("-inf")
    return logits


def _chunk_rows(n: int, vocab_size: int, device_type: str = "cpu") -> int:
    return max(1, min(n, max(HEAD_CHUNK_MIN_ROWS, chunk_elements(device_type) // vocab_size)))


def _head_chunk(hc, yc, w, bias, scale: float, n_valid: int, want_h: bool, want_w: bool, want_b: bool):
    """One chunk of rows: its summed loss and its gradients, each None when not wanted.

    hc (n, C) and w (V, C) in the compute dtype, yc (n,); rows of w from n_valid on are padding.
    Returns the loss (), d/dh (n, C) in the compute dtype, d/dW (V, C) and d/db (V,) in fp32.
    """
    logits = _chunk_logits(hc, w, bias, scale, n_valid)  # (n, V) fp32
    lse = torch.logsumexp(logits, dim=-1)  # (n,)
    loss = (lse - logits.gather(1, yc[:, None]).squeeze(1)).sum()
    if not (want_h or want_w or want_b):
        return loss, None, None, None
    # d(sum of losses)/d(logits) = softmax - onehot(y)
    d = torch.exp(logits - lse[:, None]).scatter_add(1, yc[:, None], -torch.ones_like(lse)[:, None])
    grad_b = d.sum(0) if want_b else None
    d = (d * scale if scale != 1.0 else d).to(w.dtype)  # (n, V): through the scale, into the matmuls
    grad_h = d @ w if want_h else None
    grad_w = (d.t() @ hc).float() if want_w else None
    return loss, grad_h, grad_w, grad_b


def _head_loop(h, w, bias, targets, scale: float, n_valid: int, wants: tuple[bool, bool, bool], chunk=_head_chunk):
    """_head_chunk over every chunk of rows: the summed loss and the gradients, accumulated (see _head_chunk)."""
    want_h, want_w, want_b = wants
    (N, C), V = h.shape, w.shape[0]
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    grad_h = torch.empty_like(h) if want_h else None  # (N, C)
    grad_w = torch.zeros((V, C), dtype=torch.float32, device=h.device) if want_w else None  # fp32 across chunks
    grad_b = torch.zeros(V, dtype=torch.float32, device=h.device) if want_b else None
    rows = _chunk_rows(N, V, h.device.type)
    for start in range(0, N, rows):
        hc, yc = h[start : start + rows].to(w.dtype), targets[start : start + rows]  # (n, C), (n,)
        loss, gh, gw, gb = chunk(hc, yc, w, bias, scale, n_valid, *wants)
        total = total + loss
        if grad_h is not None:
            grad_h[start : start + rows] = gh.to(h.dtype)
        if grad_w is not None:
            grad_w += gw
        if grad_b is not None:
            grad_b += gb
    return total, grad_h, grad_w, grad_b


# A compiled step either traces the head's chunk loop into its graph or calls it as one opaque
# operator. Traced is faster, but inductor schedules the chunks of one graph together and keeps
# buffers of each alive: measured at config b (V = 50,304, 2,048 rows), a step's memory was 481 MiB
# at 4 chunks, 517 at 7, 850 at 16 and 1,179 at 25, which approaches the logits the fused head
# exists to avoid. So past HEAD_GRAPH_MAX_CHUNKS chunks the step calls the loop through this
# operator, a graph node inductor cannot look into, with each chunk's arithmetic compiled on its
# own: one chunk's buffers at a time (486 MiB at 16 chunks), at about 30% more time a step.
HEAD_GRAPH_MAX_CHUNKS = 8
_compiled_chunk = None  # torch.compile(_head_chunk), made on first use


@torch.library.custom_op("tiecli::fused_head", mutates_args=())
def _fused_head(
    h: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    scale: float,
    n_valid: int,
    want_h: bool,
    want_w: bool,
    want_b: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """_head_loop as one operator, each chunk compiled; a gradient not wanted comes back empty."""
    global _compiled_chunk
    if _compiled_chunk is None:
        _compiled_chunk = torch.compile(_head_chunk, fullgraph=True, dynamic=False)
    out = _head_loop(h, w, bias, targets, scale, n_valid, (want_h, want_w, want_b), chunk=_compiled_chunk)
    return tuple(h.new_empty(0) if t is None else t for t in out)  # type: ignore[return-value]


@_fused_head.register_fake
def _(h, w, bias, targets, scale, n_valid, want_h, want_w, want_b):
    (V, C), f32 = w.shape, torch.float32
    return (
        h.new_empty((), dtype=f32),
        h.new_empty(h.shape) if want_h else h.new_empty(0),
        h.new_empty((V, C), dtype=f32) if want_w else h.new_empty(0),
        h.new_empty((V,), dtype=f32) if want_b else h.new_empty(0),
    )


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_i CE(scale * h_i W^T + b, y_i), in chunks of rows, with its gradients computed on the way.

    Liger-Kernel's fused linear cross-entropy, in plain torch: each chunk's logits live only while
    its softmax, loss and gradients are computed, so the (N, V) logits never exist whole. The
    gradients of the summed loss are computed in forward (the softmax is at hand there) and
    backward only scales them by the incoming gradient, which mean and sum reductions make one
    number: the step does the head's three matmuls once, as the plain path does.
    """

    @staticmethod
    def forward(ctx, h, weight, bias, targets, scale: float, dtype: torch.dtype):
        wants = tuple(ctx.needs_input_grad[:3])  # h, weight, bias (False for a bias that is None)
        V, pad = weight.shape[0], HEAD_PAD.get(h.device.type, 1)
        w = _padded(weight.to(dtype), pad)  # (V', C): cast and padded once, not per chunk
        b = None if bias is None else _padded(bias, pad)  # (V',)
        chunks = math.ceil(h.shape[0] / _chunk_rows(h.shape[0], w.shape[0], h.device.type))
        if torch.compiler.is_compiling() and chunks > HEAD_GRAPH_MAX_CHUNKS:
            total, *grads = _fused_head(h, w, b, targets, scale, V, *wants)
            grad_h, grad_w, grad_b = (g if want else None for g, want in zip(grads, wants))
        else:
            total, grad_h, grad_w, grad_b = _head_loop(h, w, b, targets, scale, V, wants)
        grad_w = None if grad_w is None else grad_w[:V]  # the padding's rows are zero: dropped
        grad_b = None if grad_b is None else grad_b[:V]
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return (
            None if grad_h is None else grad_h * grad_total.to(grad_h.dtype),
            None if grad_w is None else (grad_w * grad_total).to(w_dtype),
            None if grad_b is None else (grad_b * grad_total).to(b_dtype),
            None,
            None,
            None,
        )


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """F.cross_entropy(scale * h @ weight.T + bias, targets) without the (N, V) logits.

    h: (N, C), weight: (V, C), targets: (N,). The softmax is in fp32; the matmuls in bf16 under bf16
    autocast. reduction "mean" or "sum" for training; "none" gives the (N,) losses and has no gradient
    (evaluation).
    """
    dtype = _head_dtype(h, weight)
    if reduction == "none":
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            raise ValueError("reduction='none' has no gradient in the fused head; use 'mean' or 'sum' to train")
        pad, V = HEAD_PAD.get(h.device.type, 1), weight.shape[0]
        w, b = _padded(weight.to(dtype), pad), None if bias is None else _padded(bias, pad)  # (V', C), (V',)
        rows, losses = _chunk_rows(h.shape[0], w.shape[0], h.device.type), []
        for start in range(0, h.shape[0], rows):
            logits = _chunk_logits(h[start : start + rows].to(dtype), w, b, scale, V)  # (n, V') fp32
            losses.append(F.cross_entropy(logits, targets[start : start + rows], reduction="none"))
        return torch.cat(losses)  # (N,)
    total = _LinearCrossEntropy.apply(h, weight, bias, targets, scale, dtype)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / h.shape[0]
    raise ValueError(f"reduction={reduction!r} is not one of mean, sum, none")


class _Fork(torch.autograd.Function):
    """w -> (w as the input side uses it, w as the output side uses it).

    Backward gives w the sum of the two sides' gradients, as autograd would for two uses of one
    tensor, and hands each side's gradient to a sink: a leaf that exists only to receive it. The
    split then comes out of the same backward pass, with no hook, so a compiled graph holds it.
    """

    @staticmethod
    def forward(ctx, w, sink_in, sink_out):
        return w.view_as(w), w.view_as(w)

    @staticmethod
    def backward(ctx, g_in, g_out):
        if g_in is None or g_out is None:  # one side unused (a lookup alone, or logits alone)
            return (g_out if g_in is None else g_in), g_in, g_out
        return g_in + g_out, g_in, g_out


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

    A shared matrix reaches its two sides through `_Fork`, whose backward also leaves each side's
    gradient in a sink, so the one backward pass that trains the model yields the input-path and
    output-path gradients separately (`split_grads`); they sum to wte.grad. The fork is always
    there, so the autograd graph, hence every number and every compiled graph, is the same with
    the diagnostics on or off.

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
        self._make_sinks()

    def _make_sinks(self) -> None:
        """Two leaves shaped like wte that receive the input- and output-path gradients (shared modes).

        Expanded zeros: no memory of their own, only their .grad. Not parameters: no optimizer,
        state_dict or gradient norm sees them. Remade after .to() (see _apply), which would
        otherwise turn a leaf into a copy with a history.
        """
        self.sinks: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.shared:
            zero = torch.zeros((), dtype=self.wte.dtype, device=self.wte.device)
            self.sinks = tuple(zero.expand(self.wte.shape).requires_grad_() for _ in range(2))  # type: ignore[assignment]

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._make_sinks()
        return self

    def split_grads(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(G_in, G_out) of a shared wte, summed over the backward passes since clear_split_grads; else None."""
        if self.sinks is None or self.sinks[0].grad is None or self.sinks[1].grad is None:
            return None
        return self.sinks[0].grad, self.sinks[1].grad

    def clear_split_grads(self) -> None:
        for sink in self.sinks or ():
            sink.grad = None

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

    def _sides(self) -> tuple[torch.Tensor, torch.Tensor]:
        """wte as the input side and as the output side use it: through the fork when shared."""
        if self.sinks is None:
            return self.wte, self.wte
        return _Fork.apply(self.wte, *self.sinks)

    def _input_matrix(self, w_in: torch.Tensor) -> torch.Tensor:
        return torch.cat([w_in, self.wte_own], dim=1) if self.mode == "partial" else w_in

    def _output_matrix(self, w_out: torch.Tensor) -> torch.Tensor:
        if self.mode in ("untied", "untied_init"):
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


class KVCache:
    """Each layer's keys and values of the positions seen so far, for generating one token at a time.

    With it a new token costs one position through the model instead of the whole context. Learned
    positions make it valid only while the context fits block_size: past that, the window slides,
    every token's position changes, and the keys must be computed again (see tiecli/sample.py).
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
        x = self.drop(tok + self.wpe(pos))  # (B, T, C)
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
