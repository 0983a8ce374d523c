"""Shared test setup: one tokenizer/data cache per session, and each test in its own working folder."""

import dataclasses

import pytest

# Small and fast: a 2-layer, 64-wide model on 32-token windows of the bundled corpus, byte tokens.
TINY = [
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


@pytest.fixture(autouse=True)
def isolated(tmp_path, tmp_path_factory, monkeypatch):
    """Run in tmp_path (so runs/ lands there) with a cache shared by the whole session."""
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def conf(*overrides):
    """The checked Config that conf/ composes with these overrides: defaults come from conf/ alone."""
    from tiecli import config

    return config.to_config(config.compose(list(overrides))[0])


def data_config(**changes):
    """The default data settings with some changed."""
    return dataclasses.replace(conf().data, **changes)
