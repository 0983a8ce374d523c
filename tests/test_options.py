"""The field's recipe as options (docs/configuration.md, "The field's recipes"): tying=tied_then_untied,
the token matrices' init stds, the norm after the embedding, and the matrices' own learning rates."""

import json

import pytest
import torch
from conftest import TINY
from helpers import one_line_error, tiecli
from test_train import GET_BATCH, interrupt_at_batch, metrics, setup

from tiecli.config.schema import GPTConfig
from tiecli.measure import diagnostics
from tiecli.model.checkpoint import load_embeddings
from tiecli.model.gpt import GPT
from tiecli.run.layout import CHECKPOINT, INIT_CHECKPOINT, SNAPSHOTS
from tiecli.run.reader import RunReader
from tiecli.train import loop as train
from tiecli.train import optim

V, C, T = 97, 32, 16


def config(mode: str, **kw) -> GPTConfig:
    return GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=4, n_embd=C, tying=mode, **kw)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(V, (2, T), generator=g), torch.randint(V, (2, T), generator=g)


def adamw_step(model: GPT, opt: torch.optim.Optimizer, seed: int) -> torch.Tensor:
    loss = model(*batch(seed))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# --- tied_then_untied ------------------------------------------------------------------------------------------


def test_tied_then_untied_is_tied_until_the_switch_then_two_matrices_that_start_equal():
    model, tied = GPT(config("tied_then_untied"), seed=1), GPT(config("tied"), seed=1)
    opt, opt_tied = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, tied))
    emb = model.emb
    assert emb.shared and emb.one_matrix and emb.untie_pending
    for seed in range(3):  # the tied phase trains exactly as tied: lm_head idle, no gradient, no AdamW state
        assert torch.equal(adamw_step(model, opt, seed), adamw_step(tied, opt_tied, seed))
        assert emb.lm_head.grad is None and emb.lm_head not in opt.state
    assert torch.equal(emb.wte, tied.emb.wte) and not emb.lm_head.any()

    before = model(*batch(9)).detach()
    optim.untie(model, opt)
    assert not emb.shared and not emb.one_matrix and bool(emb.untied)
    assert torch.equal(emb.lm_head, emb.wte) and emb.lm_head.data_ptr() != emb.wte.data_ptr()
    assert torch.equal(model(*batch(9)), before)  # the same function at the switch: only the gradients split
    # each matrix continues with the shared one's AdamW state, in a tensor of its own
    shared, head = opt.state[emb.wte], opt.state[emb.lm_head]
    assert set(head) == {"step", "exp_avg", "exp_avg_sq"} and int(head["step"]) == 3
    assert all(torch.equal(head[k], shared[k]) and head[k].data_ptr() != shared[k].data_ptr() for k in head)
    loss = model(*batch(4))
    loss.backward()
    assert emb.split_grads() is None  # no fork now: each matrix gets its own path's gradient
    g_out = emb.lm_head.grad
    assert g_out is not None and emb.wte.grad is not None and not torch.equal(g_out, emb.wte.grad)
    opt.step()
    assert not torch.equal(emb.lm_head, emb.wte)  # from here the two move apart


def test_the_gradient_split_reads_the_one_matrix_then_the_two():
    """diagnostics' two paths: the fork's sinks of the shared wte before the switch (summing to its
    gradient), the two matrices' own gradients after it; R4's pair geometry follows the same matrices."""
    model = GPT(config("tied_then_untied"), seed=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    emb = model.emb
    model(*batch(0)).backward()
    g_in, g_out = diagnostics.gradient_paths(emb)
    assert emb.wte.grad is not None and torch.allclose(g_in + g_out, emb.wte.grad, atol=1e-7)
    w_in, w_out = diagnostics.path_matrices(emb)
    assert w_in is emb.wte and w_out is emb.wte
    opt.step()
    opt.zero_grad(set_to_none=True)
    emb.clear_split_grads()
    optim.untie(model, opt)
    model(*batch(1)).backward()
    g_in, g_out = diagnostics.gradient_paths(emb)
    assert g_in is emb.wte.grad and g_out is emb.lm_head.grad
    w_in, w_out = diagnostics.path_matrices(emb)
    assert w_in is emb.wte and w_out is emb.lm_head


def test_the_phase_travels_with_the_weights_into_checkpoints_and_snapshots():
    model = GPT(config("tied_then_untied"), seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    adamw_step(model, opt, 0)
    tied_state = {k: v.clone() for k, v in model.state_dict().items()}
    optim.untie(model, opt)
    adamw_step(model, opt, 1)
    fresh = GPT(config("tied_then_untied"), seed=5)
    fresh.load_state_dict(model.state_dict())
    assert not fresh.emb.untie_pending and torch.equal(fresh(*batch(3)), model(*batch(3)))
    fresh.load_state_dict(tied_state)  # and back: a snapshot from before the switch is one matrix again
    assert fresh.emb.untie_pending and fresh.emb.one_matrix
    assert torch.equal(fresh.emb.output_matrix(), fresh.emb.wte)


def test_parameter_counts_give_both_phases():
    counts = GPT(config("tied_then_untied")).param_counts()
    tied, untied = GPT(config("tied")).param_counts(), GPT(config("untied")).param_counts()
    assert counts["tied_phase_total"] == tied["total"]
    assert {k: v for k, v in counts.items() if k != "tied_phase_total"} == untied


@pytest.mark.slow
def test_tied_then_untied_resumes_exactly_before_at_and_after_the_switch(tmp_path, monkeypatch):
    """TINY's 12 steps untie before step 7 (round(0.5 x 12) = 6 steps tied); stopped after 5, 6 and 8
    steps and resumed, each run equals the straight one bit for bit: weights, AdamW state, metrics,
    geometry (one matrix at 0 and 6, two at 12)."""
    cfg, files = setup("tying=tied_then_untied", "tying.untie_at=0.5", "diag.every=3")
    whole = train.train(cfg, tmp_path / "whole", False, files)
    reference = torch.load(tmp_path / "whole" / CHECKPOINT, weights_only=True)
    geometry = RunReader(tmp_path / "whole").geometry()
    assert [(e.step, e.to_dict()["tied"]) for e in geometry] == [(0, True), (6, True), (12, False)]
    assert reference["model"]["emb.untied"] and whole.params["tied_phase_total"] < whole.params["total"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]  # noqa: E731
    for stop in (5, 6, 8):
        name = f"stop{stop}"
        interrupt_at_batch(monkeypatch, stop + 1)  # the draw of step stop + 1, which step `stop` prefetches
        with pytest.raises(train.Interrupted, match=f"interrupted at step {stop}/12"):
            train.train(cfg, tmp_path / name, False, files)
        assert bool(torch.load(tmp_path / name / CHECKPOINT, weights_only=True)["model"]["emb.untied"]) is (stop > 6)
        monkeypatch.setattr("tiecli.train.prepare.get_batch", GET_BATCH)
        resumed = train.train(cfg, tmp_path / name, True, files)
        assert resumed.final_val == whole.final_val, name
        assert strip(metrics(tmp_path / name)) == strip(metrics(tmp_path / "whole")), name
        assert RunReader(tmp_path / name).geometry() == geometry, name
        ckpt = torch.load(tmp_path / name / CHECKPOINT, weights_only=True)
        assert all(torch.equal(ckpt["model"][k], v) for k, v in reference["model"].items()), name
        a, b = ckpt["optimizer"]["state"], reference["optimizer"]["state"]
        assert a.keys() == b.keys() and all(torch.equal(a[i][k], b[i][k]) for i in b for k in b[i]), name
    # the snapshots say their phase: geometry --step reloads one matrix before the switch, two after
    init = load_embeddings(tmp_path / "whole" / INIT_CHECKPOINT, cfg.model, "whole")
    last = load_embeddings(tmp_path / "whole" / SNAPSHOTS / "step_12.pt", cfg.model, "whole")
    assert init.one_matrix and not last.one_matrix


# --- init stds, the norm after the embedding ---------------------------------------------------------------


def test_output_and_embedding_stds_for_untied():
    default, zero = GPT(config("untied"), seed=0).emb, GPT(config("untied", output_std=0.0), seed=0).emb
    assert not zero.lm_head.any() and torch.equal(zero.wte, default.wte)  # zeros draw nothing: same wte
    wide = GPT(config("untied", embedding_std=0.8, output_std=0.001), seed=0).emb
    assert wide.wte.std().item() == pytest.approx(0.8, rel=0.05)
    assert wide.lm_head.std().item() == pytest.approx(0.001, rel=0.05)
    assert default.wte.std().item() == pytest.approx(0.02, rel=0.05)  # null: GPT-2's, as before the option
    shared = GPT(config("tied_then_untied", embedding_std=0.005), seed=0).emb
    assert shared.wte.std().item() == pytest.approx(0.005, rel=0.05)
    with pytest.raises(ValueError, match="output_std=-1"):
        config("untied", output_std=-1.0)


def test_embedding_norm_gives_the_first_block_unit_rms_inputs_and_no_parameter():
    seen = {}
    model = GPT(config("untied", embedding_norm=True, embedding_std=0.8))
    model.h[0].register_forward_pre_hook(lambda _, args: seen.update(x=args[0]))
    idx, _ = batch()
    logits = model(idx)
    rms = seen["x"].pow(2).mean(-1).sqrt()  # (B, T)
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)
    plain = GPT(config("untied", embedding_std=0.8))
    plain.h[0].register_forward_pre_hook(lambda _, args: seen.update(x=args[0]))
    assert not torch.allclose(plain(idx), logits)
    assert seen["x"].pow(2).mean().sqrt().item() == pytest.approx(0.8, rel=0.1)  # unnormalised: the embedding's std
    assert model.param_counts() == plain.param_counts()


# --- learning rates as the field sets them -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["untied", "tied_then_untied"])
def test_input_and_output_matrices_train_at_rates_150x_apart(mode):
    """modded-nanogpt's record 8: embedding 0.3, head 0.002 (150x); the schedule scales both alike."""
    cfg, _ = setup(f"tying={mode}", "train.lr=0.003", "train.lr_embedding=0.3", "train.lr_output=0.002")
    model = GPT(cfg.model)
    opt = optim.make_optimizer(model, cfg.train, torch.device("cpu"))
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    assert scale[id(model.emb.wte)] / scale[id(model.emb.lm_head)] == pytest.approx(150)
    assert scale[id(model.emb.wte)] * cfg.train.lr == pytest.approx(0.3)


# --- config: the keys and where they go ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, text",
    [
        (
            ["tying=tied", "tying.untie_at=0.5"],
            "tying.untie_at is read by tying=tied_then_untied only, not by tying=tied",
        ),
        (["tying=tied_then_untied", "tying.output_std=0"], "tying.output_std is read by tying=untied only"),
        (
            ["tying=hybrid", "tying.embedding_std=0.1"],
            "read by tying=tied_then_untied and tying=untied, not by tying=hybrid",
        ),
    ],
)
def test_a_recipe_key_of_another_tying_choice_is_one_line_naming_the_choice(isolated, override, text):
    one_line_error(tiecli("train", *TINY, *override, "--name", "x"), 2, text)
    assert not (isolated / "runs").exists()


@pytest.mark.slow
def test_config_yaml_records_the_options_and_the_report_groups_and_labels_by_them(isolated):
    base = [*TINY, "diag.every=0", "diag.geometry=false"]
    runs = {
        "u": ["tying=untied"],
        "u0": ["tying=untied", "tying.output_std=0", "model.embedding_norm=true"],
        "ttu": ["tying=tied_then_untied", "tying.untie_at=0.5"],
    }
    for name, extra in runs.items():
        result = tiecli("train", *base, *extra, "--name", name)
        assert result.exit_code == 0, result.output
    stored = RunReader(isolated / "runs" / "u0").config()
    assert stored["tying"]["output_std"] == 0 and stored["model"]["embedding_norm"] is True
    assert RunReader(isolated / "runs" / "ttu").config()["tying"]["untie_at"] == 0.5
    result = tiecli("report", isolated / "runs")
    assert result.exit_code == 0, result.output
    groups = {g["group"] for g in json.loads((isolated / "report" / "results.json").read_text())["groups"]}
    assert groups == {
        "nano untied model.embedding_norm=False tying.output_std=None",
        "nano untied model.embedding_norm=True tying.output_std=0",
        "nano tied_then_untied model.embedding_norm=False tying.output_std=None",
    }
