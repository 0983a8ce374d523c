import os
import signal

import pytest
import torch
from conftest import TINY

from tiecli.config.checks import to_config
from tiecli.config.compose import compose, to_yaml
from tiecli.errors import Interrupted, TiecliError
from tiecli.run.layout import CHECKPOINT, CONFIG, INIT_CHECKPOINT, METRICS, OVERRIDES
from tiecli.run.reader import RunReader
from tiecli.train import loop as train
from tiecli.train import optim, prepare

# The originals, to put back mid-test (monkeypatch.undo() would also undo conftest's cache and folder).
GET_BATCH, EVALUATE = prepare.get_batch, train.evaluate


def setup(*overrides):
    """TINY with the overrides (which replace TINY's values of the same keys): the Config and the run's files."""
    keys = {o.split("=", 1)[0] for o in overrides}
    cfg, choices = compose([*(o for o in TINY if o.split("=", 1)[0] not in keys), *overrides])
    files = {CONFIG: to_yaml(cfg), OVERRIDES: "overrides: []\n"}
    return to_config(cfg), files


def metrics(run_dir):
    return [r.to_dict() for r in RunReader(run_dir).metrics()]


def geometry(run_dir):
    return [e.to_dict() for e in RunReader(run_dir).geometry()]


@pytest.mark.slow
def test_a_run_writes_a_self_describing_directory(tmp_path):
    cfg, files = setup()
    summary = train.train(cfg, tmp_path / "run", False, files)
    run = tmp_path / "run"
    assert summary == RunReader(run).summary()
    assert summary.status == "completed" and summary.step == 12 and summary.tokens == 12 * 4 * 32
    assert summary.params["total"] > 0 and summary.versions["torch"] == torch.__version__
    rows = metrics(run)
    assert [r["step"] for r in rows] == [0, 3, 6, 9, 10, 12]  # every log_interval, plus diag.every=10
    assert "grad_cos" in rows[4] and "grad_cos" not in rows[3]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "tokens"} <= rows[1].keys()
    assert (
        [r["step"] for r in rows if "val_loss" in r]
        == [r["step"] for r in rows if "train_eval_loss" in r]
        == [0, 6, 12]
    )
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] and rows[-1]["train_eval_loss"] < rows[0]["train_eval_loss"]
    evals = RunReader(run).evals()
    assert set(evals) == {"val", "train", "test"} and {e.step for e in evals.values()} == {12}
    assert summary.final_val["loss"] == evals["val"].loss
    assert (run / CHECKPOINT).is_file() and (run / INIT_CHECKPOINT).is_file()


def interrupt_at_batch(monkeypatch, n):
    """Send ourselves SIGINT while the n-th batch is drawn, as a user's Ctrl-C would arrive mid-step."""
    calls = {"n": 0}

    def get_batch(*args):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGINT)
        return GET_BATCH(*args)

    monkeypatch.setattr("tiecli.train.prepare.get_batch", get_batch)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["model.dropout=0.1", "train.grad_accum=2"]])
def test_interrupt_then_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch, extra):
    cfg, files = setup(*extra)
    whole = train.train(cfg, tmp_path / "whole", False, files)

    # during step 5, between checkpoints: the draws of step 6, which step 5 prefetches
    interrupt_at_batch(monkeypatch, 6 * cfg.train.grad_accum)
    with pytest.raises(Interrupted, match="interrupted at step 5/12"):
        train.train(cfg, tmp_path / "split", False, files)
    stopped = RunReader(tmp_path / "split").summary()
    assert stopped.status == "interrupted" and stopped.step == 5
    monkeypatch.setattr("tiecli.train.prepare.get_batch", GET_BATCH)
    # As if the process had been killed later: lines past the checkpoint, the last one torn.
    with open(tmp_path / "split" / METRICS, "a") as f:
        f.write('{"step": 6, "tokens": 768, "lr": 0.1, "loss": 0.0}\n{"step": 7, "lo')

    resumed = train.train(cfg, tmp_path / "split", True, files)
    assert resumed.final_val == whole.final_val
    strip = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]  # noqa: E731
    assert strip(metrics(tmp_path / "split")) == strip(metrics(tmp_path / "whole"))
    assert geometry(tmp_path / "split") == geometry(tmp_path / "whole")
    a = torch.load(tmp_path / "whole" / CHECKPOINT, weights_only=True)["model"]
    b = torch.load(tmp_path / "split" / CHECKPOINT, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_stop_before_the_first_step_checkpoints_and_resumes_cleanly(tmp_path, monkeypatch):
    cfg, files = setup()
    calls = {"n": 0}

    def evaluate_then_ctrl_c(*args, **kwargs):  # one Ctrl-C arrives during the step-0 evaluation
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return EVALUATE(*args, **kwargs)

    monkeypatch.setattr(train, "evaluate", evaluate_then_ctrl_c)
    with pytest.raises(Interrupted, match="interrupted at step 0/12"):
        train.train(cfg, tmp_path / "run", False, files)
    assert (tmp_path / "run" / CHECKPOINT).is_file()
    monkeypatch.setattr(train, "evaluate", EVALUATE)
    train.train(cfg, tmp_path / "run", True, files)
    assert [r["step"] for r in metrics(tmp_path / "run")] == [0, 3, 6, 9, 10, 12]
    assert [e["step"] for e in geometry(tmp_path / "run")] == [0, 6, 12]


def test_resume_refuses_changed_data(tmp_path, monkeypatch):
    text = tmp_path / "notes.txt"
    text.write_text("".join(f"line {i} of some notes about nothing much\n" for i in range(3000)))
    cfg, files = setup("data=textfile", f"data.path={text}")
    interrupt_at_batch(monkeypatch, 2)
    with pytest.raises(Interrupted):
        train.train(cfg, tmp_path / "run", False, files)
    monkeypatch.setattr("tiecli.train.prepare.get_batch", GET_BATCH)
    text.write_text(text.read_text() + "a new line that changes the corpus\n")
    with pytest.raises(TiecliError, match="the data or tokenizer changed since 'run' was trained"):
        train.train(cfg, tmp_path / "run", True, files)


def test_a_failing_run_is_marked_failed(tmp_path, monkeypatch):
    cfg, files = setup()
    calls = {"n": 0}

    def broken(*args):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("disk on fire")
        return GET_BATCH(*args)

    monkeypatch.setattr("tiecli.train.prepare.get_batch", broken)
    with pytest.raises(RuntimeError):
        train.train(cfg, tmp_path / "run", False, files)
    summary = RunReader(tmp_path / "run").summary()
    assert summary.status == "failed" and summary.error == "RuntimeError: disk on fire"
    assert summary.step == 3


@pytest.mark.slow
def test_corrupt_checkpoint_is_reported_in_one_line(tmp_path):
    cfg, files = setup()
    run = tmp_path / "run"
    train.train(cfg, run, False, files)
    (run / CHECKPOINT).write_bytes(b"not a checkpoint")
    with pytest.raises(TiecliError) as e:
        train.train(cfg, run, True, files)
    assert "is corrupt or unreadable" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_learning_rate_schedule():
    c, _ = setup("train.max_steps=110", "train.lr=1.0", "train.min_lr=0.1", "train.warmup_steps=10")
    assert optim.lr_at(0, c) == pytest.approx(0.1)
    assert optim.lr_at(9, c) == pytest.approx(1.0)
    assert optim.lr_at(60, c) == pytest.approx(0.55)
    assert optim.lr_at(110, c) == pytest.approx(0.1)
    by_fraction, _ = setup("train.max_steps=200", "train.lr=1.0", "train.warmup_fraction=0.1")
    assert (
        by_fraction.warmup == 20
        and optim.lr_at(9, by_fraction) == pytest.approx(0.5)
        and optim.lr_at(19, by_fraction) == 1.0
    )


def test_embeddings_can_be_exempt_from_weight_decay():
    from tiecli.model.gpt import GPT

    cfg, _ = setup("tying=untied")
    model = GPT(cfg.model)
    decayed = lambda opt: {id(p) for p in opt.param_groups[0]["params"]}  # noqa: E731
    with_emb = decayed(optim.make_optimizer(model, cfg.train, torch.device("cpu")))
    cfg.train.decay_embeddings = False
    without = decayed(optim.make_optimizer(model, cfg.train, torch.device("cpu")))
    assert id(model.emb.wte) in with_emb and id(model.emb.wte) not in without
    assert id(model.h[0].attn.c_attn.weight) in without
    assert all(p.dim() >= 2 for p in model.parameters() if id(p) in with_emb)


def groups(opt, model):
    """Each parameter's (lr_scale, weight_decay), by name."""
    where = {id(p): (g["lr_scale"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    return {name: where[id(p)] for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["untied", "tied", "tied_bias", "partial", "hybrid"])
def test_token_matrices_get_their_own_learning_rates(mode):
    from tiecli.model.gpt import GPT

    cfg, _ = setup(f"tying={mode}", "train.lr=0.002", "train.lr_embedding=0.02", "train.lr_output=0.0005")
    model = GPT(cfg.model)
    by_name = groups(optim.make_optimizer(model, cfg.train, torch.device("cpu")), model)
    roles = model.emb.roles
    for name, (scale, _) in by_name.items():
        role = roles.get(name.removeprefix("emb.")) if name.startswith("emb.") else None
        # the input side, and a shared matrix (the input embedding too), at lr_embedding; the output side at lr_output
        expected = {"input": 10.0, "shared": 10.0, "output": 0.25}.get(role, 1.0)
        assert scale == pytest.approx(expected), name
    assert by_name["wpe.weight"][0] == 1.0 and by_name["h.0.attn.c_attn.weight"] == (1.0, 0.1)
    assert by_name["h.0.attn.c_attn.bias"] == (1.0, 0.0)


@pytest.mark.slow
def test_default_learning_rates_keep_two_groups_and_the_loop_scales_the_schedule(tmp_path):
    from tiecli.model.gpt import GPT

    cfg, _ = setup("tying=untied")
    model = GPT(cfg.model)
    opt = optim.make_optimizer(model, cfg.train, torch.device("cpu"))
    assert [(g["weight_decay"], g["lr_scale"]) for g in opt.param_groups] == [(0.1, 1.0), (0.0, 1.0)]

    cfg, files = setup("tying=untied", "train.lr_embedding=0.03", "train.lr_output=0.001")
    train.train(cfg, tmp_path / "run", False, files)
    saved = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)["optimizer"]["param_groups"]
    last = optim.lr_at(cfg.max_steps - 1, cfg)  # the rate of the last step
    assert sorted(g["lr"] / last for g in saved) == pytest.approx(sorted(g["lr_scale"] for g in saved))
    assert sorted({g["lr_scale"] for g in saved}) == pytest.approx([1 / 3, 1.0, 10.0])


@pytest.mark.slow
def test_evaluations_spread_over_the_run_and_snapshots_thinned(tmp_path):
    cfg, files = setup("train.evals=6", "diag.max_snapshots=3", "eval.test=false")
    train.train(cfg, tmp_path / "run", False, files)
    run = tmp_path / "run"
    rows = metrics(run)
    assert [r["step"] for r in rows if "val_loss" in r] == [0, 2, 4, 6, 8, 10, 12]
    assert all("train_eval_loss" in r for r in rows if "val_loss" in r)
    assert [e["step"] for e in geometry(run)] == [0, 2, 4, 6, 8, 10, 12]
    assert RunReader(run).snapshot_steps() == [0, 6, 12]  # 3 of 7, evenly: the first, the middle, the last
    assert (run / INIT_CHECKPOINT).is_file() and set(RunReader(run).evals()) == {"val", "train"}


@pytest.mark.slow
def test_a_resume_that_changes_the_schedule_thins_the_old_snapshots(tmp_path):
    cfg, files = setup("train.evals=3", "diag.max_snapshots=3")
    train.train(cfg, tmp_path / "run", False, files)
    assert RunReader(tmp_path / "run").snapshot_steps() == [0, 8, 12]  # of 0, 4, 8, 12
    longer, _ = setup("train.evals=3", "diag.max_snapshots=3", "train.max_steps=24")
    train.train(longer, tmp_path / "run", True, files)
    assert RunReader(tmp_path / "run").snapshot_steps() == [0, 16, 24]  # of 0, 8, 16, 24; 12 is off the plan


@pytest.mark.slow
def test_the_final_training_split_evaluation_is_a_fixed_subset(tmp_path):
    from tiecli.data.tokens import load_corpus
    from tiecli.measure.evaluate import TRAIN_EVAL_FACTOR, whole_split_limit

    cfg, files = setup()
    corpus = load_corpus(cfg.data, cfg.tokenizer)
    T = cfg.model.block_size
    limit = whole_split_limit(corpus, "train", T)
    val_windows = -(-(len(corpus.tokens["val"]) - 1) // T)
    assert (
        limit == TRAIN_EVAL_FACTOR * val_windows and len(corpus.tokens["train"]) > limit * T
    )  # the bundled corpus: a subset
    assert whole_split_limit(corpus, "val", T) is None and whole_split_limit(corpus, "test", T) is None
    train.train(cfg, tmp_path / "run", False, files)
    evals = RunReader(tmp_path / "run").evals()
    assert evals["train"].n_tokens == limit * T
    assert (
        evals["val"].n_tokens == len(corpus.tokens["val"]) - 1
        and evals["test"].n_tokens == len(corpus.tokens["test"]) - 1
    )
