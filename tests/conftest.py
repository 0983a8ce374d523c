"""Shared test setup: one tokenizer/data cache per session, and each test in its own working folder.

`slow` (pyproject.toml) marks a test whose cost is training beyond the session's shared runs (DDP, compile,
real processes, sweeps of jobs, repeated trainings) or a report over many synthetic runs, where a cheaper
test in its module drives the same code end to end; `pytest -m "not slow"` is the everyday minute."""

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

# Small and fast: a 2-layer, 64-wide model on 32-token windows of tiny.txt (the first TINY_CHARS of the
# bundled corpus, in every test's folder), byte tokens. A small corpus keeps the whole-split evaluations
# at the end of each run to a fraction of a second; the bundled corpus itself is tested where it matters.
TINY_CHARS = 240_000
TINY = [
    "data=textfile",
    "data.path=tiny.txt",
    "model=nano",
    "model.block_size=32",
    "tokenizer=bytes",
    "train.batch_size=4",
    "train.max_steps=12",
    "train.warmup_steps=2",
    "train.eval_interval=6",
    "train.eval_batches=2",
    "train.log_interval=3",
    "train.checkpoint_interval=6",
]


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory) -> Path:
    """TINY's corpus: the bundled corpus's first TINY_CHARS, cut at a line end, written once per session."""
    from tiecli.data.corpus import load_documents

    text = "".join(t for _, t in load_documents(conf().data))[:TINY_CHARS]
    path = tmp_path_factory.getbasetemp() / "tiny.txt"
    path.write_text(text[: text.rindex("\n") + 1])
    return path


@pytest.fixture(autouse=True)
def isolated(tmp_path, tmp_path_factory, monkeypatch, tiny_text):
    """Run in tmp_path (so runs/ lands there, next to TINY's tiny.txt) with a cache shared by the whole session."""
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    os.link(tiny_text, tmp_path / "tiny.txt")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_trained(tmp_path_factory, tiny_text) -> Path:
    """Run r of TINY (`tiecli train TINY --name r`: 12 steps, checkpoints at 6 and 12), trained once per
    session in a folder of its own set up as `isolated` sets up a test's. Read it only: tiny_run copies it."""
    from helpers import trained_once

    folder = tmp_path_factory.mktemp("tiny-trained")
    os.link(tiny_text, folder / "tiny.txt")
    return trained_once(folder, tmp_path_factory.getbasetemp() / "cache", TINY, "r")


@pytest.fixture
def tiny_run(isolated, tiny_trained) -> Path:
    """runs/r in the test's folder: its own copy of tiny_trained, to change as it likes."""
    return Path(shutil.copytree(tiny_trained, isolated / "runs" / "r"))


def conf(*overrides):
    """The checked Config that conf/ composes with these overrides: defaults come from conf/ alone."""
    from tiecli.config.checks import to_config
    from tiecli.config.compose import compose

    return to_config(compose(list(overrides))[0])


def data_config(**changes):
    """The default data settings with some changed."""
    return dataclasses.replace(conf().data, **changes)


@pytest.fixture
def sweep(tmp_path):
    """nano and micro, tied and untied, seeds 0-2, as a sweep folder of synthetic runs (helpers.write_run)."""
    from helpers import LOSS, write_run

    root = tmp_path / "runs" / "sweeps" / "grid"
    for size, mode in LOSS:
        for seed in range(3):
            write_run(root, size, mode, seed)
    (root / "sweep.json").write_text("{}")
    return root
