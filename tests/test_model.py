import math

import pytest
import torch

from tiecli.config.schema import TYING_MODES, GPTConfig
from tiecli.model.gpt import GPT, KVCache, count_params

V, C, L, T = 97, 32, 2, 16


def config(mode: str, **kw) -> GPTConfig:
    return GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=4, n_embd=C, tying=mode, **kw)


def expected_embedding_params(mode: str, k: int = C // 2, r: int = 16) -> dict:
    """Closed-form parameter counts of the token embedding/output parameters per mode."""
    return {
        "untied": {"input_embedding": V * C, "output_matrix": V * C, "shared": 0},
        "untied_init": {"input_embedding": V * C, "output_matrix": V * C, "shared": 0},
        "tied": {"input_embedding": 0, "output_matrix": 0, "shared": V * C},
        "scaled": {"input_embedding": 0, "output_matrix": 0, "shared": V * C},
        "tied_bias": {"input_embedding": 0, "output_matrix": V, "shared": V * C},
        "partial": {"input_embedding": V * (C - k), "output_matrix": V * (C - k), "shared": V * k},
        "hybrid": {"input_embedding": 0, "output_matrix": V * r + r * C, "shared": V * C},
        "tied_then_untied": {"input_embedding": V * C, "output_matrix": V * C, "shared": 0},  # as it ends
    }[mode]


@pytest.mark.parametrize("mode", TYING_MODES)
def test_param_counts_match_formula(mode):
    counts = GPT(config(mode)).param_counts()
    assert {k: counts[k] for k in ("input_embedding", "output_matrix", "shared")} == expected_embedding_params(mode)
    block = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    assert counts["non_embedding"] == L * block + 2 * C  # blocks + final LayerNorm
    assert counts["positional"] == T * C
    assert counts["total"] == sum(
        counts[k] for k in ("input_embedding", "output_matrix", "shared", "positional", "non_embedding")
    )
    assert counts == count_params(config(mode))  # the meta-device count used by `tiecli info`


def test_partial_and_hybrid_settings_change_counts():
    counts = GPT(config("partial", shared_fraction=0.25)).param_counts()
    assert counts["shared"] == V * 8 and counts["input_embedding"] == V * 24
    assert (
        GPT(config("partial", shared_fraction=1.0)).param_counts()["total"]
        == GPT(config("tied")).param_counts()["total"]
    )
    assert (
        GPT(config("partial", shared_fraction=0.0)).param_counts()["total"]
        == GPT(config("untied")).param_counts()["total"]
    )
    assert GPT(config("hybrid", rank=4)).param_counts()["output_matrix"] == V * 4 + 4 * C


def test_gpt2_small_published_counts():
    gpt2 = dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    tied = count_params(GPTConfig(**gpt2, tying="tied"))
    untied = count_params(GPTConfig(**gpt2, tying="untied"))
    assert tied["total"] == 124_439_808
    assert untied["total"] - tied["total"] == 50257 * 768


def test_tied_shares_one_tensor():
    model = GPT(config("tied"))
    emb = model.emb
    assert emb.input_matrix().data_ptr() == emb.output_matrix().data_ptr() == emb.wte.data_ptr()
    assert sum(p.shape == (V, C) for p in model.parameters()) == 1
    # Both paths reach the one tensor: rows of tokens absent from the input get gradient through the logits.
    idx = torch.zeros(2, T, dtype=torch.long)
    model(idx, idx).backward()
    assert emb.wte.grad[1:].abs().sum() > 0


def test_tie_survives_state_dict_round_trip(tmp_path):
    from tiecli.model import checkpoint

    model = GPT(config("tied"))
    (tmp_path / "m.pt").write_bytes(checkpoint.to_bytes({"model": model.state_dict()}))
    loaded = GPT(config("tied"))
    checkpoint.load_weights(loaded, checkpoint.load(tmp_path / "m.pt", "r", keys=("model",))["model"], "r", "weights")
    assert torch.equal(loaded.emb.wte, model.emb.wte)
    assert loaded.emb.output_matrix().data_ptr() == loaded.emb.input_matrix().data_ptr() == loaded.emb.wte.data_ptr()


def test_untied_init_starts_equal_but_separate():
    emb = GPT(config("untied_init")).emb
    assert torch.equal(emb.lm_head, emb.wte)
    assert emb.lm_head.data_ptr() != emb.wte.data_ptr()
    assert not torch.equal(GPT(config("untied")).emb.lm_head, GPT(config("untied")).emb.wte)


def test_hybrid_starts_at_the_input_embedding():
    emb = GPT(config("hybrid", rank=4)).emb
    assert torch.equal(emb.output_matrix(), emb.input_matrix())
    with torch.no_grad():
        emb.lm_u.add_(1.0)
    assert not torch.equal(emb.output_matrix(), emb.input_matrix())


def test_partial_shares_the_first_dimensions():
    emb = GPT(config("partial", shared_fraction=0.5)).emb
    w_in, w_out = emb.input_matrix(), emb.output_matrix()
    assert torch.equal(w_in[:, : C // 2], w_out[:, : C // 2])
    assert not torch.equal(w_in[:, C // 2 :], w_out[:, C // 2 :])


def test_scaled_and_bias_change_the_logits_as_documented():
    torch.manual_seed(0)
    tied = GPT(config("tied"))
    x = torch.randn(2, 3, C)
    scaled = GPT(config("scaled", scale_logits=True, scale_inputs=True))
    scaled.load_state_dict(tied.state_dict())
    assert torch.allclose(scaled.emb.decode(x), tied.emb.decode(x) / math.sqrt(C))
    idx = torch.tensor([[1, 2, 3]])
    assert torch.allclose(scaled.emb.encode(idx), tied.emb.encode(idx) * math.sqrt(C))
    biased = GPT(config("tied_bias"))
    biased.load_state_dict({**tied.state_dict(), "emb.lm_bias": torch.arange(V, dtype=torch.float)}, strict=True)
    assert torch.allclose(biased.emb.decode(x), tied.emb.decode(x) + torch.arange(V))


@pytest.mark.parametrize("mode", TYING_MODES)
def test_every_mode_learns(mode):
    torch.manual_seed(0)
    model = GPT(config(mode))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, V, (4, T + 1))
    losses = []
    for _ in range(30):
        loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(V), abs=0.3)  # small init: near-uniform predictions
    assert losses[-1] < losses[0] - 1.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="tying mode 'glued'"):
        config("glued")
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig(vocab_size=V, block_size=T, n_layer=L, n_head=4, n_embd=30)
    with pytest.raises(ValueError, match="shared_fraction"):
        config("partial", shared_fraction=1.5)


def test_one_seed_gives_every_mode_the_same_body():
    """A same-seed pair of modes differs only in its token matrices: the body draws from its own generator."""

    def body(mode, seed):
        torch.manual_seed(1000 + seed)  # the global RNG plays no part
        kw = {"shared_fraction": 0.25} if mode == "partial" else {"scale_logits": True} if mode == "scaled" else {}
        return {k: v for k, v in GPT(config(mode, **kw), seed=seed).state_dict().items() if not k.startswith("emb.")}

    reference = body("untied", 3)
    assert "h.0.attn.c_attn.weight" in reference and "wpe.weight" in reference and "ln_f.weight" in reference
    for mode in TYING_MODES:
        other = body(mode, 3)
        assert other.keys() == reference.keys()
        assert all(torch.equal(other[k], reference[k]) for k in reference), mode
    other_seed = body("untied", 4)
    assert not torch.equal(other_seed["h.0.attn.c_attn.weight"], reference["h.0.attn.c_attn.weight"])
    assert not torch.equal(other_seed["wpe.weight"], reference["wpe.weight"])
    # The token matrices: each mode draws wte first, so the plain (V, C) modes also share their input matrix.
    wte = {mode: GPT(config(mode), seed=3).emb.wte for mode in ("untied", "untied_init", "tied", "tied_bias", "hybrid")}
    assert all(torch.equal(w, wte["untied"]) for w in wte.values())
    assert not torch.equal(GPT(config("tied"), seed=4).emb.wte, wte["tied"])


def test_meta_construction_draws_nothing_and_matches_shapes():
    state = torch.get_rng_state()
    with torch.device("meta"):
        model = GPT(config("untied"), seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.is_meta for p in model.parameters())
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in GPT(config("untied")).state_dict().items()
    }


@pytest.mark.parametrize(
    "scales, logit_std, input_std",
    [
        ({}, 0.02 * math.sqrt(128), 0.02),  # tied: GPT-2's 0.02 everywhere, logits start small
        ({"scale_logits": True}, 1.0, 1.0),  # T5: std 1.0 rows, logits / sqrt(C)
        ({"scale_inputs": True}, 1.0, 1.0),  # Gemma: std 1/sqrt(C) rows, inputs x sqrt(C)
        ({"scale_logits": True, "scale_inputs": True}, 128**-0.5, 1.0),  # both: the inputs decide
    ],
)
def test_scaled_starts_with_its_origins_init(scales, logit_std, input_std):
    cfg = GPTConfig(vocab_size=512, block_size=T, n_layer=1, n_head=4, n_embd=128, tying="scaled", **scales)
    emb = GPT(cfg, seed=0).emb
    h = torch.randn(
        64, 128, generator=torch.Generator().manual_seed(1)
    )  # what LayerNorm hands the output: ~1 per dimension
    with torch.no_grad():
        logits, inputs = emb.decode(h), emb.encode(torch.arange(512))
    assert logits.std().item() == pytest.approx(logit_std, rel=0.1)
    assert inputs.std().item() == pytest.approx(input_std, rel=0.1)


@pytest.mark.parametrize("mode", TYING_MODES)
def test_kv_cache_gives_the_full_forward_logits(mode):
    model = GPT(config(mode), seed=3).eval()
    idx = torch.randint(V, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)  # (2, T, V)
        cache = KVCache(model.config)
        # A prompt of 5, a chunk of 3 after it (the mask must offset the causal triangle), then one at a time.
        parts = [model(idx[:, :5], cache=cache), model(idx[:, 5:8], cache=cache)]
        parts += [model(idx[:, t : t + 1], cache=cache) for t in range(8, T)]
    assert cache.length == T
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=f"sequence of length {T + 1} is longer than block_size={T}"):
        model(idx[:, :1], cache=cache)  # a full cache takes no more: learned positions end at block_size
