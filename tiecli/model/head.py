# Used by tiecli/model/gpt.py: the loss of `GPT.forward` and the tying split of `Embeddings`; imports only torch.
"""The output head's two autograd pieces: the fused linear + cross-entropy, and the fork that splits a tied
matrix's gradient into its input-path and output-path parts.

`linear_cross_entropy` is F.cross_entropy(h @ W.T + b, y) computed in chunks of rows, so the (N, V)
logits never exist whole; under torch.compile, past HEAD_GRAPH_MAX_CHUNKS chunks it runs as one
custom operator (`tiecli::fused_head`). `Fork` hands a shared matrix to the input and the output side
and leaves each side's gradient in a sink (tiecli/model/gpt.py: Embeddings).
"""

import math

import torch
import torch.nn.functional as F

HEAD_CHUNK_ELEMENTS = 2**22  # on a CPU the fused head holds about this many logits (16 MB in fp32) at a time,
HEAD_CHUNK_MIN_ROWS = 512  # but at least this many rows: thinner matmuls run far below the peak (README)
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


class Fork(torch.autograd.Function):
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
