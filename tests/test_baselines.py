"""Count-model baselines: the formulas on hand-countable token streams, and their way into summary.json and the report."""

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import TINY
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.measure import baselines
from tiecli.run.reader import RunReader


def corpus(train: list[int], val: list[int], vocab: int, token_bytes: list[int] | None = None):
    return SimpleNamespace(
        encoding=SimpleNamespace(n_vocab=vocab),
        tokens={"train": np.array(train), "val": np.array(val)},
        token_bytes=np.array(token_bytes or [1] * vocab),
        key="test",
    )


def test_unigram_and_bigram_match_counts_by_hand():
    # train: 0 1 0 1 0 2 (V = 3); val: 0 1 2, so the scored tokens are 1 and 2.
    scores = baselines.score_corpus(corpus([0, 1, 0, 1, 0, 2], [0, 1, 2], 3, token_bytes=[1, 2, 3]))
    p_uni = [(2 + 1) / (6 + 3), (1 + 1) / (6 + 3)]  # c(1) = 2, c(2) = 1
    assert scores["unigram"]["loss"] == pytest.approx(-np.mean(np.log(p_uni)))
    k = scores["bigram"]["k"]
    # pairs in train: (0,1) x2, (1,0) x2, (0,2) x1; c(0 followed) = 3, c(1 followed) = 2
    p_bi = [(2 + k) / (3 + 3 * k), (0 + k) / (2 + 3 * k)]  # p(1 | 0), p(2 | 1): an unseen pair
    assert scores["bigram"]["loss"] == pytest.approx(-np.mean(np.log(p_bi)))
    assert scores["bigram"]["perplexity"] == pytest.approx(math.exp(scores["bigram"]["loss"]))
    nll_bits = -np.sum(np.log2(p_bi))
    assert scores["bigram"]["bits_per_byte"] == pytest.approx(nll_bits / (2 + 3))  # bytes of tokens 1 and 2
    assert scores["tokens"] == 2 and scores["counted_train_tokens"] == 6


def test_k_is_the_best_of_the_grid_on_the_scored_split():
    train, val = [0, 1, 0, 1, 0, 2], [0, 1, 2]
    chosen = baselines.score_corpus(corpus(train, val, 3))["bigram"]
    for k, nll in baselines.bigram_nll(np.array(train), np.array(val), 3, baselines.K_GRID).items():
        assert chosen["loss"] <= nll.mean() + 1e-12, k


def test_a_deterministic_sequence_is_nearly_free_for_the_bigram_but_not_the_unigram():
    alternating = [0, 1] * 500
    scores = baselines.score_corpus(corpus(alternating, alternating[:200], 2))
    assert scores["unigram"]["perplexity"] == pytest.approx(2.0, rel=1e-3)
    assert scores["bigram"]["perplexity"] < 1.01


@pytest.mark.slow
def test_train_stores_the_baselines_and_the_report_puts_runs_against_them(isolated):
    runner = CliRunner()
    result = runner.invoke(app, ["train", *TINY, "eval.test=false", "--name", "r"])
    assert result.exit_code == 0, result.output
    summary = RunReader(isolated / "runs" / "r").summary()
    stored = summary.corpus["baselines"]
    assert stored["unigram"]["perplexity"] > stored["bigram"]["perplexity"] > 1
    result = runner.invoke(app, ["report", "runs", "--out", "rep"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "How far the runs got" in result.output  # the terminal's headline; the tables are in report.md
    page = (isolated / "rep" / "report.md").read_text()
    assert "count-model baselines" in page and f"{stored['bigram']['perplexity']:.4g}" in page
    (row,) = [r for r in csv.DictReader(open(isolated / "rep" / "results.csv")) if r["kind"] == "run"]
    assert float(row["epochs"]) == pytest.approx(summary.tokens / summary.corpus["train_tokens"])
    assert float(row["bigram_perplexity"]) == pytest.approx(stored["bigram"]["perplexity"])
