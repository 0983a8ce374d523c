"""Trackers read back as their users would: TensorBoard's EventAccumulator and W&B's offline run files."""

import json
import struct
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.config.compose import compose, to_yaml
from tiecli.run.layout import CHECKPOINT, CONFIG, OVERRIDES, TRACKERS
from tiecli.run.reader import RunReader
from tiecli.run.records import EvalResult, GeometryEntry, MetricsRow, Summary
from tiecli.run.writer import RunWriter
from tiecli.train import trackers

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
pytest.importorskip("wandb", reason="the wandb extra is not installed")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from wandb.proto import wandb_internal_pb2  # noqa: E402

runner = CliRunner()


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch, tmp_path):
    """W&B never reaches the network and keeps its own files in the test's folder."""
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
        "WANDB_CACHE_DIR": tmp_path / "wandb-cache",
        "WANDB_DATA_DIR": tmp_path / "wandb-data",
    }.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def tiecli(*args):
    return runner.invoke(app, [str(a) for a in args])


def scalars(logdir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def wandb_records(run_file: Path):
    """The records of a W&B .wandb file: a 7-byte header, then LevelDB log blocks of 32 KiB."""
    data, position, pending = run_file.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a chunk header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(run_dir: Path) -> tuple[list, dict[int, dict]]:
    """The run records and the logged rows by step, over every offline run of the run directory."""
    runs, rows = [], {}
    for run_file in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                runs.append(record.run)
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                rows[row["_step"]] = row
    return runs, rows


def test_trackers_mirror_the_run_directory(tmp_path):
    result = tiecli(
        "train", *TINY, "eval.test=false", "--name", "tracked",
        "logger=[tensorboard,wandb]", "logger.tensorboard.projector=true",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "tracked"
    reader = RunReader(run)
    rows = [r.to_dict() for r in reader.metrics()]
    tb = scalars(run / trackers.TB_DIR)

    # Every metrics.jsonl value is a TensorBoard scalar of the same name at the same step (TensorBoard keeps float32).
    # (a null, such as the pair statistics of a vocabulary with no related-form pairs, is no value to mirror)
    logged = {(k, r["step"]) for r in rows for k in r if k != "step" and r[k] is not None}
    assert logged == {(tag, step) for tag, by_step in tb.items() if "/" not in tag for step in by_step}
    assert all(tb[k][r["step"]] == np.float32(v) for r in rows for k, v in r.items() if k != "step" and v is not None)
    # Geometry entries, the final evaluation and summary values, under their own prefixes.
    entries = reader.geometry()
    assert [e.step for e in entries] == sorted(tb["geometry/input/anisotropy"]) == [0, 6, 12]
    assert all(tb["geometry/input/anisotropy"][e.step] == np.float32(e.input["anisotropy"]) for e in entries)
    assert tb["eval/val/loss"] == {12: np.float32(reader.evals()["val"].loss)}
    assert tb["summary/best_val_loss"] == {12: np.float32(reader.summary().best_val_loss)}
    # The config as hyperparameters, in this run's own event file (one HParams session per run).
    events = EventAccumulator(str(run / trackers.TB_DIR))
    events.Reload()
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")
    assert b"tying.mode" in events.PluginTagToContent("hparams")["_hparams_/session_start_info"]

    # The projector: the tied model's one matrix, every token (bytes seen in training) labelled with its id and string.
    folder = run / trackers.TB_DIR / "00012" / "shared_matrix"
    labels = (folder / "metadata.tsv").read_text(encoding="utf-8").splitlines()
    vectors = np.loadtxt(folder / "tensors.tsv", delimiter="\t")
    assert labels[0] == "id\ttoken" and len(labels) - 1 == len(vectors) == 256
    first = int(labels[1].split("\t")[0])
    assert labels[1] == f"{first}\t{chr(first)!r}"  # the most frequent byte: a letter or a space, quoted
    wte = torch.load(run / CHECKPOINT, weights_only=True)["model"]["emb.wte"]
    np.testing.assert_allclose(vectors[0], wte[first].numpy(), rtol=1e-5, atol=1e-6)

    # W&B: an offline run in the run directory, its id kept in trackers.json, the same rows as metrics.jsonl.
    record = json.loads((run / TRACKERS).read_text())["wandb"]
    assert record["mode"] == "offline" and record["group"] is None
    runs, history = wandb_history(run)
    assert [r.run_id for r in runs] == [record["id"]] and runs[0].display_name == "tracked"
    assert sorted(history) == [r["step"] for r in rows]
    assert all(
        history[r["step"]][k] == pytest.approx(v, rel=1e-12)
        for r in rows
        for k, v in r.items()
        if k != "step" and v is not None
    )


def make_run(path: Path, *overrides: str) -> RunWriter:
    """A run directory with a config and a summary, no training: what RunWriter sends its trackers is under test."""
    cfg, choices = compose([*TINY, *overrides])
    summary = Summary(
        path.name, "running", 0, {}, 12, 128, 0, 0, "cpu", "fp32", False, {}, {}, "2026-01-01T00:00:00+00:00"
    )
    files = {CONFIG: to_yaml(cfg), OVERRIDES: f"overrides: []\nchoices: {json.dumps(choices)}\n"}
    return trackers.create_run(path, files, summary, b"")


def test_a_resume_continues_the_wandb_run_and_tensorboard_hides_the_redone_steps(tmp_path):
    run_dir = tmp_path / "runs" / "resumed"
    with make_run(run_dir, "logger=[tensorboard,wandb]") as run:
        for step in range(0, 11, 2):
            run.log(MetricsRow(step, step * 128, 0.1, loss=10.0 - step))
    first_id = json.loads((run_dir / TRACKERS).read_text())["wandb"]["id"]
    with trackers.open_run(run_dir) as run:  # as `tiecli train --resume` does, from a checkpoint at step 6
        run.truncate_after(6)
        for step in range(8, 15, 2):
            run.log(MetricsRow(step, step * 128, 0.1, loss=100.0 + step))
    losses = {r.step: r.loss for r in RunReader(run_dir).metrics()}
    assert losses == {0: 10.0, 2: 8.0, 4: 6.0, 6: 4.0, 8: 108.0, 10: 110.0, 12: 112.0, 14: 114.0}
    assert scalars(run_dir / trackers.TB_DIR)["loss"] == losses
    runs, history = wandb_history(run_dir)
    assert [r.run_id for r in runs] == [first_id, first_id]  # two offline pieces of one W&B run
    assert json.loads((run_dir / TRACKERS).read_text())["wandb"]["id"] == first_id
    assert {step: row["loss"] for step, row in history.items() if step > 6} == {
        8: 108.0,
        10: 110.0,
        12: 112.0,
        14: 114.0,
    }


def test_a_sweep_groups_its_runs(tmp_path):
    sweep_dir = tmp_path / "runs" / "sweeps" / "modes"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.json").write_text("{}")  # trackers only look for the manifest
    for name in ("job-tied", "job-untied"):
        with make_run(sweep_dir / name, "logger=[tensorboard,wandb]") as run:
            run.log(MetricsRow(0, 0, 0.0, loss=1.0))
    runs = [wandb_history(sweep_dir / name)[0][0] for name in ("job-tied", "job-untied")]
    assert [(r.run_group, r.display_name) for r in runs] == [("modes", "job-tied"), ("modes", "job-untied")]
    # One TensorBoard logdir for the sweep: its folder holds each job's event files.
    assert {p.parent.parent.name for p in sweep_dir.glob("*/tb/events.out.tfevents.*")} == {"job-tied", "job-untied"}


def test_a_later_command_only_appends(tmp_path):
    """eval after training reaches the trackers; a re-measured earlier step stays out of them."""
    run_dir = tmp_path / "runs" / "later"
    with make_run(run_dir, "logger=[tensorboard]") as run:
        run.log(MetricsRow(0, 0, 0.0, loss=2.0))
        run.log(MetricsRow(12, 0, 0.0, loss=1.0))
        run.summary(Summary(**{**asdict(run.reader.summary()), "status": "completed", "step": 12}))
    by_bucket: dict = {}
    with trackers.open_run(run_dir) as run:
        run.eval(EvalResult("test", 12, 1.5, 4.48, 2.0, 100, 300, by_bucket))
        run.geometry(GeometryEntry(0, True, 10, {"anisotropy": 0.5}, {"anisotropy": 0.5}))
    tb = scalars(run_dir / trackers.TB_DIR)
    assert tb["eval/test/loss"] == {12: 1.5} and "geometry/input/anisotropy" not in tb
    assert [e.step for e in RunReader(run_dir).geometry()] == [0]  # the run directory has it all the same


def test_bad_logger_settings_are_one_line(tmp_path, monkeypatch):
    cases = [
        (["logger=[tensorboard,mlflow]"], 2, "'mlflow' is unknown or repeated; valid choices: tensorboard, wandb"),
        (["logger.tensorboard.projector=true"], 2, "add logger=[tensorboard]"),
        (["logger=[wandb]", "logger.wandb.mode=cloud"], 2, "logger.wandb.mode='cloud' is not valid"),
    ]
    for overrides, code, text in cases:
        result = tiecli("train", *TINY, *overrides)
        assert result.exit_code == code and text in result.output and result.output.strip().count("\n") == 0
    monkeypatch.setitem(trackers.PACKAGES, "wandb", "tiecli_no_such_module")  # as without the wandb extra
    result = tiecli("train", *TINY, "logger=[wandb]", "--name", "no-extra")
    assert result.exit_code == 1 and result.output.strip().count("\n") == 0
    assert "logger=wandb needs the wandb package: pip install 'tiecli[wandb]'" in result.output
    assert not (tmp_path / "runs" / "no-extra").exists()  # refused before the run directory was made
