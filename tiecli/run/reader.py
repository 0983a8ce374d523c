"""RunReader: typed, validated reading of one run directory, and nothing else."""

import json
import zipfile
from pathlib import Path

import numpy as np

from tiecli.errors import TiecliError
from tiecli.run.files import FormatError, is_locked, read_json, read_yaml
from tiecli.run.layout import (
    CHECKPOINT,
    CONFIG,
    EVAL,
    GEOMETRY,
    KEPT,
    LOCK,
    METRICS,
    OVERRIDES,
    ROW_SAMPLE,
    SNAPSHOTS,
    SUMMARY,
    TRACKERS,
)
from tiecli.run.records import STATUSES, EvalResult, GeometryEntry, MetricsRow, Summary, check_format, parse_record


class RunReader:
    """Typed, validated access to one run directory's files. Every error is one line naming the run."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name

    def _what(self, filename: str, kind: str) -> str:
        return f"run {self.name}: {filename} is not {kind}"

    def config(self) -> dict:
        return read_yaml(self.path / CONFIG, f"run {self.name}")

    def overrides(self) -> dict:
        obj = read_yaml(self.path / OVERRIDES, f"run {self.name}")
        if not isinstance(obj.get("choices"), dict) or not isinstance(obj.get("overrides", []), list):
            raise FormatError(self._what(OVERRIDES, "a record of overrides and group choices"))
        return obj

    def summary(self) -> Summary:
        obj = read_json(self.path / SUMMARY, f"run {self.name}")
        check_format(obj, f"run {self.name}: {SUMMARY}")
        summary = parse_record(Summary, obj, self._what(SUMMARY, "a run summary"))
        if summary.status not in STATUSES:
            raise FormatError(self._what(SUMMARY, f"a run summary (status {summary.status!r})"))
        return summary

    def status(self) -> str | None:
        """The summary's status, None without one; a `running` run whose writer is gone reads `interrupted`."""
        if not (self.path / SUMMARY).is_file():
            return None
        status = self.summary().status
        return "interrupted" if status == "running" and not self.in_use() else status

    def in_use(self) -> bool:
        return is_locked(self.path / LOCK)

    def metrics(self) -> list[MetricsRow]:
        """Every complete row; a torn last line (a killed writer) is ignored, a malformed whole line is an error."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, ValueError) as e:
            raise FormatError(f"run {self.name}: {METRICS} is unreadable ({type(e).__name__})") from None
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                if number == len(lines):  # the last line, with no newline: a write cut short
                    continue
                raise FormatError(self._what(METRICS, f"JSON lines (line {number})")) from None
            if isinstance(obj, dict) and "step" not in obj and "format" in obj:
                check_format(obj, f"run {self.name}: {METRICS}")
                continue
            rows.append(parse_record(MetricsRow, obj, self._what(METRICS, f"a metrics log (line {number})")))
        return rows

    def evals(self) -> dict[str, EvalResult]:
        path = self.path / EVAL
        if not path.is_file():
            return {}
        obj = read_json(path, f"run {self.name}")
        check_format(obj, f"run {self.name}: {EVAL}")
        if not isinstance(obj, dict) or not isinstance(obj.get("splits"), dict):
            raise FormatError(self._what(EVAL, "a record of evaluations"))
        return {
            s: parse_record(EvalResult, e, self._what(EVAL, f"a record of evaluations ({s})"))
            for s, e in obj["splits"].items()
        }

    def geometry(self) -> list[GeometryEntry]:
        path = self.path / GEOMETRY
        if not path.is_file():
            return []
        obj = read_json(path, f"run {self.name}")
        check_format(obj, f"run {self.name}: {GEOMETRY}")
        if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
            raise FormatError(self._what(GEOMETRY, "a list of geometry entries"))
        return [
            parse_record(GeometryEntry, e, self._what(GEOMETRY, "a list of geometry entries")) for e in obj["entries"]
        ]

    def trackers(self) -> dict:
        """trackers.json: what the run keeps about its trackers (the W&B run id); {} without one."""
        if not (self.path / TRACKERS).is_file():
            return {}
        obj = read_json(self.path / TRACKERS, f"run {self.name}")
        check_format(obj, f"run {self.name}: {TRACKERS}")
        if not isinstance(obj, dict):
            raise FormatError(self._what(TRACKERS, "a record of trackers"))
        return obj

    def final_val(self) -> dict | None:
        """The full validation split's metrics: eval.json's val, else summary.json's final_val."""
        val = self.evals().get("val")
        return val.brief() if val else self.summary().final_val

    def row_sample(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None] | None:
        """rows.npz: (step, token ids (n,), input rows (n, C), output rows (n, C) or None when the mode has one
        matrix), float16 as stored; None when the run has none (trained before tiecli wrote it, or diag.geometry off)."""
        path = self.path / ROW_SAMPLE
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as f:
                output = f["output"] if "output" in f.files else None
                return int(f["step"]), f["ids"], f["input"], output
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            raise FormatError(f"run {self.name}: {ROW_SAMPLE} is not a readable row sample ({e})") from None

    def snapshot_steps(self) -> list[int]:
        return _steps(self.path / SNAPSHOTS)

    def kept_steps(self) -> list[int]:
        """The steps of the full checkpoints that train.keep_checkpoints kept (checkpoints/step_N.pt)."""
        return _steps(self.path / KEPT)

    def full_checkpoint(self, step: str) -> Path:
        """The file that holds --step STEP's full weights if any does: a kept step_N.pt, else last.pt
        (whose step the caller checks once loaded: checkpoint.check_step)."""
        kept = self.path / KEPT / f"step_{int(step)}.pt" if step.isascii() and step.isdigit() else None
        return kept if kept is not None and kept.is_file() else self.path / CHECKPOINT

    def check_corpus(self, key: str) -> None:
        """Refuse to resume or evaluate a run on data other than what it was trained on."""
        corpus = self.summary().corpus
        trained = corpus.get("key")
        if trained is not None and trained != key and "key_scheme" not in corpus:
            raise TiecliError(
                f"{self.name!r} was trained by a tiecli older than 0.2, whose corpus keys hashed the split texts; "
                f"this one hashes the input files and cannot check that the data is the same (corpus key {trained}, "
                f"now {key}): evaluate or resume it with the tiecli that trained it (versions in summary.json)"
            )
        if trained is not None and trained != key:
            raise TiecliError(
                f"the data or tokenizer changed since {self.name!r} was trained "
                f"(corpus key {trained}, now {key}): its token ids would not mean the same"
            )


def _steps(folder: Path) -> list[int]:
    """N of each step_N.pt in folder, ascending."""
    return sorted(
        int(p.stem.removeprefix("step_")) for p in folder.glob("step_*.pt") if p.stem.removeprefix("step_").isdigit()
    )
