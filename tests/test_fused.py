"""The fused linear + cross-entropy head (tiecli/model/head.py) against the plain path, and the gradient split it feeds."""

import pytest
import torch
import torch.nn.functional as F

from tiecli.config.schema import TYING_MODES, GPTConfig
from tiecli.measure import diagnostics
from tiecli.model import head
from tiecli.model.gpt import GPT
from tiecli.model.head import linear_cross_entropy

V, C, T = 97, 32, 16
SHARED = ["tied", "tied_bias", "scaled", "partial", "hybrid"]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """7 rows a chunk: the 48 rows of a batch span 7 chunks, the last one short."""
    monkeypatch.setattr(head, "HEAD_CHUNK_ELEMENTS", 7 * V)
    monkeypatch.setattr(head, "HEAD_CHUNK_MIN_ROWS", 1)


def gpt(mode: str) -> GPT:
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=C, tying=mode, rank=4, scale_logits=True)
    m = GPT(cfg, seed=0)
    with torch.no_grad():  # away from the init (zero bias, zero U, untied_init's copy), so every part matters
        for p in m.emb.parameters():
            p.normal_(0.0, 0.3)
    return m


def batch():
    idx = torch.randint(0, V // 2, (3, T + 1), generator=torch.Generator().manual_seed(1))
    idx[:, 1:] = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(2))  # every target possible
    return idx[:, :-1], idx[:, 1:]


def grads(m: GPT) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    m.emb.clear_split_grads()
    return out


@pytest.mark.parametrize("mode", TYING_MODES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fused_head_gives_the_plain_loss_and_gradients(mode, dtype, tol):
    """Loss and every parameter's gradient match F.cross_entropy on the full logits, in fp32 to
    rounding and under bf16 autocast to bf16's precision (both paths then multiply in bf16).
    fp32's 1e-5 of the largest entry: sums over the 48 rows, whose order the threads decide, differed
    by 2.1e-6 of it on a loaded machine."""
    m, (x, y) = gpt(mode), batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        fused = m(x, y)
        fused.backward()
        g_fused = grads(m)
        plain = F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())  # logits: the unfused head
        plain.backward()
        g_plain = grads(m)
    assert fused.dtype == torch.float32 and abs(fused.item() - plain.item()) < tol * plain.item()
    for name, g in g_plain.items():
        scale = g.abs().max().item()
        assert scale > 0, name
        assert (g_fused[name] - g).abs().max().item() <= tol * scale, name


@pytest.mark.parametrize("mode", TYING_MODES)
def test_padded_head_gives_the_unpadded_loss_and_gradients(mode, monkeypatch):
    """The head padded to a multiple of 64 (97 -> 128 rows, as CUDA pads 50,257 -> 50,304): the padding is
    masked out of the softmax, so the loss, the per-token losses and every gradient are the unpadded ones,
    and no parameter or count holds a padding row."""
    m, (x, y) = gpt(mode), batch()
    runs = {}
    for pad in ({}, {"cpu": 64}):
        monkeypatch.setattr(head, "HEAD_PAD", pad)
        loss = m(x, y)
        loss.backward()
        with torch.no_grad():
            per_token = m(x, y, reduction="none")
        runs[bool(pad)] = loss, per_token, grads(m)
    (loss, per_token, g), (loss_p, per_token_p, g_p) = runs[False], runs[True]
    assert head._padded(torch.zeros(50257, 2), 64).shape == (50304, 2)
    assert torch.allclose(loss_p, loss, rtol=1e-6) and torch.allclose(per_token_p, per_token, rtol=1e-6, atol=1e-6)
    for name, grad in g.items():
        assert g_p[name].shape == grad.shape and torch.allclose(g_p[name], grad, rtol=1e-5, atol=1e-7), name
    assert all(p.shape[0] in (V, T, C, 4, 2 * C, 3 * C, 4 * C) for p in m.parameters())
    assert m.param_counts()["total"] == sum(p.numel() for p in m.parameters())


def test_reductions_and_scales():
    torch.manual_seed(0)
    h, w, b = torch.randn(20, C), torch.randn(V, C), torch.randn(V)
    y = torch.randint(0, V, (20,))
    logits = 0.5 * h @ w.t() + b
    with torch.no_grad():
        per_row = linear_cross_entropy(h, w, y, b, 0.5, reduction="none")
    assert torch.allclose(per_row, F.cross_entropy(logits, y, reduction="none"), atol=1e-5)
    total = linear_cross_entropy(h, w, y, b, 0.5, reduction="sum")
    assert torch.allclose(total, F.cross_entropy(logits, y, reduction="sum"), rtol=1e-6)
    with pytest.raises(ValueError, match="reduction='none' has no gradient"):
        linear_cross_entropy(h, w.requires_grad_(), y, b, 0.5, reduction="none")
    with pytest.raises(ValueError, match="reduction='max' is not one of mean, sum, none"):
        linear_cross_entropy(h, w, y, b, 0.5, reduction="max")


def test_plain_calls_still_give_logits():
    m, (x, _) = gpt("hybrid"), batch()
    logits = m(x)
    assert logits.shape == (3, T, V)
    assert torch.allclose(logits, m.emb.decode(m.ln_f(m.h[0](m.emb.encode(x) + m.wpe(torch.arange(T))))), atol=1e-6)


@pytest.mark.parametrize("mode", SHARED)
def test_split_sums_exactly_to_the_shared_gradient(mode):
    """G_in + G_out == wte.grad bit for bit with the fused head on; G_in lives only on input tokens."""
    m, (x, y) = gpt(mode), batch()
    m(x, y).backward()
    g_in, g_out = diagnostics.gradient_paths(m.emb)
    assert torch.equal(g_in + g_out, m.emb.wte.grad)
    absent = torch.ones(V, dtype=torch.bool)
    absent[x.flatten()] = False
    assert absent.any() and g_in[absent].abs().sum() == 0 and g_in[~absent].abs().sum() > 0
    assert g_out[absent].abs().sum() > 0  # every row gets an output-path gradient
    # the output path alone, from the plain head's gradient w.r.t. the output matrix
    w_out = m.emb.output_matrix().detach().requires_grad_()
    h = m.ln_f(m.h[0](m.emb.encode(x) + m.wpe(torch.arange(T)))).detach()
    F.cross_entropy(m.emb.logits(h, w_out, getattr(m.emb, "lm_bias", None)).flatten(0, 1), y.flatten()).backward()
    k = m.emb.wte.shape[1]  # partial: the shared columns
    assert torch.allclose(g_out, w_out.grad[:, :k], atol=1e-7, rtol=1e-5)


def test_sinks_follow_the_model_and_stay_out_of_its_state():
    m = gpt("tied").to(torch.float64)
    assert all(s.dtype == torch.float64 and s.is_leaf and s.requires_grad for s in m.emb.sinks)
    assert not any(n.startswith("emb.sink") for n in m.state_dict())
    assert sum(p.numel() for p in m.parameters()) == m.param_counts()["total"]
    assert gpt("untied").emb.sinks is None and gpt("untied").emb.split_grads() is None


@pytest.mark.slow
@pytest.mark.parametrize("mode, in_graph", [("partial", True), ("partial", False), ("tied_bias", False)])
def test_compiled_step_matches_eager_with_the_split(mode, in_graph, monkeypatch):
    """torch.compile of the whole forward (fused head, fork) in one graph: same loss, gradients and split,
    whether the head's 7 chunks are traced into the graph or run as the tiecli::fused_head operator
    (which compiles each chunk on its own the first time it runs); tied_bias with the head padded (97 -> 128)."""
    monkeypatch.setattr(head, "HEAD_GRAPH_MAX_CHUNKS", 7 if in_graph else 6)
    monkeypatch.setattr(head, "HEAD_PAD", {"cpu": 64} if mode == "tied_bias" else {})
    monkeypatch.setattr(head, "_compiled_chunk", None)
    torch.compiler.reset()
    m, (x, y) = gpt(mode), batch()
    eager_loss = m(x, y)
    eager_loss.backward()
    eager_split = [g.clone() for g in diagnostics.gradient_paths(m.emb)]
    eager = grads(m)
    compiled = torch.compile(m, fullgraph=True, dynamic=False)
    for _ in range(3):  # the last pass is the one compared
        grads(m)
        loss = compiled(x, y)
        loss.backward()
    assert (head._compiled_chunk is None) == in_graph  # the operator ran, or the loop is in the graph
    assert torch.allclose(loss, eager_loss, rtol=1e-5)
    for a, b in zip(diagnostics.gradient_paths(m.emb), eager_split):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    for name, g in grads(m).items():
        assert torch.allclose(g, eager[name], atol=1e-6, rtol=1e-4), name


def test_chunks_hold_about_a_fixed_number_of_logits_but_never_thin_rows(monkeypatch):
    """4M logits a chunk at a large vocabulary would be 83 rows at GPT-2's; the floor keeps 512."""
    monkeypatch.setattr(head, "HEAD_CHUNK_ELEMENTS", 2**22)
    monkeypatch.setattr(head, "HEAD_CHUNK_MIN_ROWS", 512)
    assert head._chunk_rows(2048, 4096) == 1024  # 4M logits
    assert head._chunk_rows(2048, 50304) == 512  # the floor, not 83
    assert head._chunk_rows(100, 50304) == 100  # never more rows than there are


def test_a_gpu_chunk_is_sized_by_its_memory_not_by_a_cpu_cache(monkeypatch):
    """On CUDA a chunk holds 2**27 logits: a 16k-token micro-batch at GPT-2's padded vocabulary is 7 chunks,
    within HEAD_GRAPH_MAX_CHUNKS (traced into the compiled step); the CPU's 4M logits would make it 32."""
    monkeypatch.setattr(head, "HEAD_CHUNK_ELEMENTS", 2**22)
    monkeypatch.setattr(head, "HEAD_CHUNK_MIN_ROWS", 512)
    assert head._chunk_rows(16384, 50304, "cuda") == 2668 and head._chunk_rows(16384, 50304, "cpu") == 512
    assert -(-16384 // head._chunk_rows(16384, 50304, "cuda")) <= head.HEAD_GRAPH_MAX_CHUNKS
