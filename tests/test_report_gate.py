"""The report's headline and the labels on its verdicts (report.gate): pilot with fewer than three seeds
or one untuned learning rate, withheld on the unigram plateau, each with the condition and its fix; plain
verdicts when none fires. Synthetic run directories whose R4 verdict is "supported" by construction."""

import math
import shutil

import pytest
from helpers import TOKENS_PER_STEP, V, make_run, params, results, tiecli

from tiecli.run.records import EvalResult, MetricsRow
from tiecli.run.writer import RunWriter

UNIGRAM = 100.0  # the corpus's unigram perplexity in these runs (bigram: half of it)


def corpus(unigram: float | None) -> dict:
    """summary.json's corpus with count-model baselines, as `tiecli train` records it; None: without
    them, as in runs made before tiecli 0.1."""
    if unigram is None:
        return {"key": "test"}

    def scores(ppl):
        return {"loss": math.log(ppl), "perplexity": ppl, "bits_per_byte": math.log2(ppl) / 2}

    return {
        "key": "test",
        "train_tokens": 200_000,
        "vocab_size": V,
        "baselines": {"split": "val", "unigram": scores(unigram), "bigram": {**scores(unigram / 2), "k": 0.03}},
    }


def gate_run(root, mode, seed, loss, lr=0.003, unigram: float | None = UNIGRAM, lr_embedding=None):
    """nano, mode, seed: final val loss `loss`; every seed's grad cos -0.3 (tied) or 0 (untied), so R4's
    Δcos is -0.3 in every seed: supported whatever the number of seeds. lr_embedding: the token matrices'
    own rate, left null (train.lr's) unless given."""
    config = {
        "device": "auto",
        "compile": False,
        "model": {"block_size": 128, "dropout": 0.0, "bias": True, "n_layer": 2, "n_head": 4, "n_embd": 64},
        "train": {"max_steps": 20, "max_tokens": None, "lr": lr, "lr_embedding": lr_embedding},
        "diag": {"every": 10},
        "tying": {"mode": mode},
        "tokenizer": {"name": "bytes", "vocab_size": V},
    }
    cos = {"grad_cos": -0.3 if mode == "tied" else 0.0}
    rows = [
        MetricsRow(step=step, tokens=step * TOKENS_PER_STEP, lr=lr, val_loss=val, diag=cos if step else {})
        for step, val in ((0, 5.0), (10, loss + 1), (20, loss))
    ]
    make_run(
        root / f"nano-{mode}-lr{lr}-emb{lr_embedding}-s{seed}",
        config,
        seed,
        loss,
        rows,
        [],
        params=params("nano", mode),
        choices={"model": "nano", "tying": mode, "data": "shakespeare", "tokenizer": "bytes"},
        corpus=corpus(unigram),
    )


def report(root, *args):
    out = root.parent / "out"
    result = tiecli("report", root, "--out", out, *args)
    assert result.exit_code == 0, result.output
    data, _, claims = results(out)
    return result.output, (out / "report.md").read_text(), data, claims


@pytest.mark.slow
def test_two_seeds_on_the_plateau_at_one_untuned_lr_withhold_every_verdict_and_say_why(tmp_path):
    """The issue's scenario: 2 seeds, the tied runs at 1.00x the unigram perplexity, one shared lr."""
    for seed in (0, 1):
        gate_run(tmp_path / "runs", "tied", seed, math.log(UNIGRAM) + 0.001 * seed)  # on the plateau
        gate_run(tmp_path / "runs", "untied", seed, math.log(0.3 * UNIGRAM) + 0.001 * seed)
    output, md, data, claims = report(tmp_path / "runs")
    r4 = claims[("R4", "nano tied")]
    assert r4["verdict"] == "supported"  # the rule's verdict is kept in results.json ...
    shown = {(c["claim"], c["comparison"]): c["verdict"] for c in data["labels"]["shown"]}
    assert shown[("R4", "nano tied")] == "withheld: supported"  # ... and shown labelled
    assert data["labels"]["label"] == "withheld"
    assert shown[("R3", "-")].startswith("no data")  # nothing measured: nothing to label
    assert shown[("C1", "nano tied")] == claims[("C1", "nano tied")]["verdict"]  # exact counts: never labelled
    md_r4 = next(line for line in md.splitlines() if line.startswith("| R4 | nano tied |"))
    assert "| withheld: supported |" in md_r4 and "| supported |" not in md_r4
    assert (
        "| withheld: nano tied at 1.00x the unigram perplexity (> 0.5x: on the plateau); 2 seeds (< 3); "
        f"train.lr 0.003 untuned. Rule: {r4['why']}" in md_r4.replace("\\|", "|")
    )
    conditions = [c["found"] + ": " + c["fix"] for c in data["labels"]["conditions"]]
    assert conditions == [
        "not off the unigram plateau: nano tied 1.00x the unigram perplexity (verdicts need at most 0.5x): train longer than 20 steps (train.max_steps) until the runs leave it",
        "2 seeds (0, 1) per group, fewer than 3: run seed=0,1,2",
        "one shared lr 0.003, untuned (no --select over a learning-rate grid): sweep train.lr (e.g. "
        "train.lr=1e-3,3e-3,1e-2) and report with --select train.lr",
    ]
    flat = " ".join(output.split())  # the terminal wraps lines at its width
    for text in conditions:
        assert text in flat and text in md
    # the headline comes first: what was compared, the difference with its interval, how far the runs got
    first = md.split("## ")[0]
    assert "Compared: tied vs untied; model nano; 20 steps (20,000 tokens, 0.1 epochs)" in first
    assert "seeds 0, 1 (2 per group)" in first and "Verdicts withheld" in first
    delta = 100 * (1 / 0.3 - 1)  # the same Δloss in both seeds: a zero-width interval
    assert (
        f"Tied vs untied, val perplexity, paired by seed, nano: +{delta:.3g} % [+{delta:.3g}, +{delta:.3g}] "
        "(2 seeds; C6 withheld: contradicted)." in first
    )
    assert "tied 1.00x unigram, 2.00x bigram; untied 0.30x unigram, 0.60x bigram" in first
    assert output.startswith("Compared: tied vs untied")
    assert md.index("## Appendix: rules") > md.index("## Figures") > md.index("## Claims")
    assert "verdict labels" in data["rules"]


@pytest.mark.slow
def test_three_seeds_off_the_plateau_with_each_lr_selected_give_plain_verdicts(tmp_path):
    for lr, offset in ((0.001, 0.2), (0.003, 0.0), (0.006, 0.1)):  # the best rate inside the grid
        for seed in range(3):
            for mode, ppl in (("tied", 0.2), ("untied", 0.25)):
                gate_run(tmp_path / "runs", mode, seed, math.log(ppl * UNIGRAM) + offset + 0.01 * seed, lr=lr)
    output, md, data, claims = report(tmp_path / "runs", "--select", "train.lr")
    assert data["labels"] == {
        "label": None,
        "conditions": [],
        "shown": [
            {"claim": c["claim"], "comparison": c["comparison"], "verdict": c["verdict"]} for c in data["claims"]
        ],
    }
    assert claims[("R4", "nano tied")]["verdict"] == "supported"
    assert "| R4 | nano tied | gradient table, grad_cos.png |" in md
    claim_lines = [line for line in md.splitlines() if line.startswith(("| R", "| C"))]
    assert len(claim_lines) > 10 and not any("| pilot:" in line or "| withheld:" in line for line in claim_lines)
    assert "pilot:" not in output and "withheld:" not in output
    assert "Verdicts: every group off the unigram plateau (at most 0.5x), 3+ seeds, each learning rate selected" in md
    assert "; train.lr chosen by --select: 0.003 (nano tied), 0.003 (nano untied); 2 groups." in md
    assert "6 runs in 2 groups (12 more runs in 4 groups not selected), 0 skipped" in " ".join(output.split())
    # without --select the same runs compare each mode at each lr, none chosen: pilot, naming both rates
    _, _, data, _ = report(tmp_path / "runs")
    assert data["labels"]["label"] == "pilot"
    assert [c["found"] for c in data["labels"]["conditions"]] == [
        "lr 0.001, 0.003, 0.006, untuned (no --select over a learning-rate grid)"
    ]


@pytest.mark.slow
def test_a_rate_chosen_at_the_edge_of_its_grid_is_a_pilot_that_names_the_edge(tmp_path):
    """The best of a grid at its end is not bracketed: the optimum may lie beyond it. Tied's loss falls
    all the way to the largest rate, untied's is lowest at the smallest; adding a rate past each edge,
    where the loss rises again, brackets both and the verdicts are plain."""
    tied = {0.001: 0.3, 0.003: 0.1, 0.006: 0.0, 0.012: 0.2}
    untied = {0.0005: 0.2, 0.001: 0.0, 0.003: 0.1, 0.006: 0.3}
    for grid in ((0.001, 0.003, 0.006), (0.0005, 0.012)):
        for lr in grid:
            for seed in range(3):
                for mode, offsets, ppl in (("tied", tied, 0.2), ("untied", untied, 0.25)):
                    if lr in offsets:
                        gate_run(
                            tmp_path / "runs", mode, seed, math.log(ppl * UNIGRAM) + offsets[lr] + 0.01 * seed, lr=lr
                        )
        _, md, data, claims = report(tmp_path / "runs", "--select", "train.lr")
        if grid[0] == 0.001:  # only the first three rates
            assert data["labels"]["label"] == "pilot"
            assert data["labels"]["conditions"] == [
                {
                    "found": "learning rate chosen at the edge of its grid: nano tied train.lr=0.006 (largest of "
                    "0.001, 0.003, 0.006), nano untied train.lr=0.001 (smallest of 0.001, 0.003, 0.006); the best "
                    "rate may lie beyond it",
                    "fix": "add a rate past each edge to the sweep (the same command with the longer list adds only "
                    "the new jobs) and report again",
                }
            ]
            shown = {(c["claim"], c["comparison"]): c["verdict"] for c in data["labels"]["shown"]}
            assert shown[("R4", "nano tied train.lr=0.006")] == "pilot: supported"
            md_r4 = next(line for line in md.splitlines() if line.startswith("| R4 | nano tied train.lr=0.006 |"))
            assert "train.lr 0.006 at its grid's upper edge; train.lr 0.001 at its grid's lower edge" in md_r4
        else:  # each mode's best now has a worse rate on both sides
            assert data["labels"]["label"] is None and data["labels"]["conditions"] == []
            assert "train.lr chosen by --select: 0.006 (nano tied train.lr=0.006), 0.001 (nano untied" in md
        assert claims[("R4", "nano tied train.lr=0.006")]["verdict"] == "supported"


@pytest.mark.slow
def test_a_matrix_rate_left_null_counts_as_the_body_rate_it_trains_at(tmp_path):
    """train.lr_embedding=null,0.006 over a body at 0.003 is the grid 0.003, 0.006: tied's best at 0.006 and
    untied's at null (0.003) are both at an edge, which counting only the numbers (one value, no grid) missed;
    0.0015 and 0.012 bracket them and the verdicts are plain."""
    tied = {None: 0.2, 0.006: 0.0, 0.0015: 0.3, 0.012: 0.1}
    untied = {None: 0.0, 0.006: 0.2, 0.0015: 0.1, 0.012: 0.3}
    for grid in ((None, 0.006), (0.0015, 0.012)):
        for rate in grid:
            for seed in range(3):
                for mode, offsets, ppl in (("tied", tied, 0.2), ("untied", untied, 0.25)):
                    loss = math.log(ppl * UNIGRAM) + offsets[rate] + 0.01 * seed
                    gate_run(tmp_path / "runs", mode, seed, loss, lr_embedding=rate)
        _, _, data, _ = report(tmp_path / "runs", "--select", "train.lr_embedding")
        if grid[0] is None:
            assert data["labels"]["label"] == "pilot"
            assert [c["found"] for c in data["labels"]["conditions"]] == [
                "learning rate chosen at the edge of its grid: nano tied train.lr_embedding=0.006 (largest of "
                "0.003, 0.006), nano untied train.lr_embedding=None (null: train.lr 0.003, the smallest of 0.003, "
                "0.006); the best rate may lie beyond it"
            ]
        else:
            assert data["labels"]["label"] is None and data["labels"]["conditions"] == []


def test_a_select_over_one_learning_rate_is_no_tuning_and_old_runs_cannot_tell_the_plateau(tmp_path):
    for seed in range(3):
        for mode in ("tied", "untied"):
            gate_run(tmp_path / "runs", mode, seed, math.log(0.2 * UNIGRAM) + 0.01 * seed)
    _, _, data, _ = report(tmp_path / "runs", "--select", "train.lr")
    assert [c["found"] for c in data["labels"]["conditions"]] == [
        "one shared lr 0.003, untuned (no --select over a learning-rate grid)"
    ]
    # summary.json without count-model baselines (runs made before them): pilot, not a verdict
    for seed in range(3):
        for mode in ("tied", "untied"):
            gate_run(tmp_path / "old", mode, seed, 3.0 + 0.01 * seed, unigram=None)
    _, _, data, _ = report(tmp_path / "old", "--select", "train.lr")
    assert data["labels"]["label"] == "pilot"
    assert {c["verdict"] for c in data["labels"]["shown"] if c["claim"] == "R4"} == {"pilot: supported"}
    assert data["labels"]["conditions"][0]["found"] == (
        "no unigram baseline in summary.json (nano tied, nano untied: made before tiecli 0.1), so the plateau cannot be told"
    )


@pytest.mark.slow
def test_a_rate_picked_on_fewer_than_three_seeds_is_a_pilot_and_the_headline_says_so(tmp_path):
    """The docs_* studies' design: each rate of the grid on seed 0, then the pick on seeds 1 and 2 as well. The pick
    rests on one seed (the only one every rate has), so its verdicts are pilot, though each group now has three seeds;
    running the other rates on seeds 1 and 2 too makes the pick one of three seeds, and the verdicts plain."""
    offsets = {0.001: 0.2, 0.003: 0.0, 0.006: 0.1}  # the best rate inside the grid
    for lr, offset in offsets.items():
        for seed in range(3) if lr == 0.003 else (0,):
            for mode, ppl in (("tied", 0.2), ("untied", 0.25)):
                gate_run(tmp_path / "runs", mode, seed, math.log(ppl * UNIGRAM) + offset + 0.01 * seed, lr=lr)
    output, md, data, claims = report(tmp_path / "runs", "--select", "train.lr")
    assert data["labels"]["label"] == "pilot"
    found = (
        "learning rates picked on fewer than 3 seeds: nano tied on 1 seed (0), nano untied on 1 seed (0); one seed's "
        "noise can decide a pick"
    )
    assert [c["found"] for c in data["labels"]["conditions"]] == [found]
    shown = {(c["claim"], c["comparison"]): c["verdict"] for c in data["labels"]["shown"]}
    assert claims[("R4", "nano tied")]["verdict"] == "supported" and shown[("R4", "nano tied")] == "pilot: supported"
    first = md.split("## ")[0]
    assert "Verdicts pilot only" in first and found in first and found in " ".join(output.split())
    md_r4 = next(line for line in md.splitlines() if line.startswith("| R4 | nano tied |"))
    assert "| pilot: learning rate picked on 1 seed (< 3). Rule:" in md_r4
    for lr in (0.001, 0.006):  # the other rates on seeds 1 and 2: the pick is made on three seeds
        for seed in (1, 2):
            for mode, ppl in (("tied", 0.2), ("untied", 0.25)):
                gate_run(tmp_path / "runs", mode, seed, math.log(ppl * UNIGRAM) + offsets[lr] + 0.01 * seed, lr=lr)
    _, _, data, _ = report(tmp_path / "runs", "--select", "train.lr")
    assert data["labels"]["label"] is None and data["labels"]["conditions"] == []


def test_a_pair_read_on_val_because_a_run_lacks_its_test_split_says_so(tmp_path):
    """Every run but one has a test evaluation: the pair is judged on val, and the headline names the run
    that moved it there instead of switching silently."""
    for mode in ("tied", "untied"):
        for seed in range(3):
            gate_run(tmp_path / "runs", mode, seed, 4.0 if mode == "tied" else 3.9)
    runs = sorted((tmp_path / "runs").iterdir())
    for run in runs[1:]:  # every run gets a test evaluation but the first
        with RunWriter.open(run) as writer:
            writer.eval(EvalResult("test", 20, 4.0, math.exp(4.0), 2.0, 5000, 10000, {}))
    result = tiecli("report", tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    headline = " ".join(result.output.split())
    assert "val perplexity, paired by seed" in headline
    assert f"on val, not test: 1 run without a test evaluation, e.g. {runs[0].name}" in headline


@pytest.mark.slow
def test_a_rate_screened_on_one_seed_brackets_a_pick_made_on_three_only_where_it_lost(tmp_path):
    """docs_ladder's design since issue 48: 0.001, 0.003 and 0.006 on seeds 0-2, and 0.012 past the edge on
    seed 0 only. The pick is made on the three seeds the three rates share (not on the one seed every rate
    has), and 0.012, worse on seed 0, brackets it: plain verdicts, the screened point listed as such. Made
    better than the pick on seed 0, the screened point leaves the pick unsettled: pilot, naming it."""
    offsets = {0.001: 0.2, 0.003: 0.1, 0.006: 0.0}  # the best of the three-seed grid at its upper edge
    for lr, offset in offsets.items():
        for seed in range(3):
            for mode, ppl in (("tied", 0.2), ("untied", 0.25)):
                gate_run(tmp_path / "runs", mode, seed, math.log(ppl * UNIGRAM) + offset + 0.01 * seed, lr=lr)

    def screen(offset):
        for mode, ppl in (("tied", 0.2), ("untied", 0.25)):
            shutil.rmtree(tmp_path / "runs" / f"nano-{mode}-lr0.012-embNone-s0", ignore_errors=True)
            gate_run(tmp_path / "runs", mode, 0, math.log(ppl * UNIGRAM) + offset, lr=0.012)
        return report(tmp_path / "runs", "--select", "train.lr")

    _, md, data, claims = screen(0.3)  # worse than 0.006 on seed 0
    assert data["labels"]["label"] is None and data["labels"]["conditions"] == []
    assert claims[("R4", "nano tied")]["verdict"] == "supported"
    screened = [d for d in data["not_selected"] if d["screened"]]
    assert {(d["values"], d["seeds"], d["chosen"]) for d in screened} == {("train.lr=0.012", 1, "train.lr=0.006")}
    assert all(d["seeds"] == 3 for d in data["not_selected"] if not d["screened"])
    assert "| 1 (screened) |" in md
    _, md, data, _ = screen(-0.1)  # now better than 0.006 on seed 0: the pick is not settled
    assert data["labels"]["label"] == "pilot"
    assert [c["found"] for c in data["labels"]["conditions"]] == [
        "a rate screened on fewer seeds beat the pick on the seeds it ran: nano tied by train.lr=0.012 on 1 seed (0), "
        "nano untied by train.lr=0.012 on 1 seed (0); the pick is not settled"
    ]
    md_r4 = next(line for line in md.splitlines() if line.startswith("| R4 | nano tied |"))
    assert "train.lr=0.012, screened on 1 seed (0), beat the pick there" in md_r4
