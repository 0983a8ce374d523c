"""RunWriter: the one writer of a run directory, and the listeners it hands each record to."""

import io
import json
import os
import shutil
import tempfile
import typing
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tiecli.errors import TiecliError
from tiecli.run.files import UMASK, FormatError, Lock, atomic_write, is_locked, remove_temporaries, write_json
from tiecli.run.layout import (
    CHECKPOINT,
    CONFIG,
    EVAL,
    FORMAT,
    GEOMETRY,
    INIT_CHECKPOINT,
    KEPT,
    LOCK,
    METRICS,
    ROW_SAMPLE,
    SNAPSHOTS,
    SUMMARY,
    TRACKERS,
    UNDO,
    is_run_dir,
)
from tiecli.run.reader import RunReader
from tiecli.run.records import EvalResult, GeometryEntry, MetricsRow, Summary


class Listener(typing.Protocol):
    """What a RunWriter hands each record to right after writing it (tiecli.train.trackers.Feed is one)."""

    def written(self, kind: str, record: dict) -> None:
        """kind: "metrics", "eval", "geometry" or "summary"; record: the JSON object the file now holds."""

    def truncated(self, last_step: int) -> None:
        """The run forgot what it recorded after last_step (-1: everything): a resume is about to redo it."""

    def close(self) -> None:
        """The writer is closing: called before it releases the run's lock."""


class RunWriter:
    """The one writer of a run directory, holding its lock from open to close.

    `create` builds a new run in a temporary folder and renames it into place; `open` takes an
    existing one (resume, eval, geometry --write). DDP's rank-0 rule plugs in here.

    Each metrics row, evaluation, geometry entry and summary goes, right after it is written, to
    the `listeners` the caller attached, in order (tiecli.train.trackers feeds TensorBoard and W&B so).
    """

    def __init__(self, path: Path, lock: Lock, start_step: int = 0):
        self.path, self.lock = Path(path), lock
        self.reader = RunReader(self.path)
        self.start_step = start_step  # the run's step when this writer took it: 0 for a new run
        self.listeners: list[Listener] = []

    @classmethod
    def open(cls, path: Path, check: Callable[[RunReader], None] | None = None) -> "RunWriter":
        """An existing run, locked; `check` (a caller's precondition) runs under the lock before anything changes."""
        path = Path(path)
        if not is_run_dir(path):
            raise TiecliError(f"{str(path)!r} is not a run directory (it has no {SUMMARY} or {CONFIG})")
        lock = Lock(path / LOCK, f"run {path.name}").acquire()
        try:
            if check is not None:
                check(RunReader(path))
            step = RunReader(path).summary().step if (path / SUMMARY).is_file() else 0
        except BaseException:
            lock.release()
            raise
        remove_temporaries(path)
        shutil.rmtree(path / UNDO, ignore_errors=True)  # an extension's restore point that its writer left (kill -9)
        return cls(path, lock, start_step=step)

    @classmethod
    def create(cls, path: Path, files: dict[str, str], summary: Summary, init: bytes) -> "RunWriter":
        """A new run directory holding `files` (config, overrides), its first summary and init checkpoint."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a creation killed midway; its lock is gone
            if stale.is_dir() and not is_locked(stale / LOCK):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        lock = Lock(tmp / LOCK, f"run {path.name}")  # flock follows the inode through the rename
        try:
            os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700; give the run the usual permissions
            lock.acquire()  # inside the try: a full disk can refuse even the lock file
            for name, text in files.items():
                atomic_write(tmp / name, text)
            atomic_write(tmp / INIT_CHECKPOINT, init)
            write_json(tmp / SUMMARY, asdict(summary))
            atomic_write(tmp / METRICS, json.dumps({"format": FORMAT}) + "\n")
            os.rename(tmp, path)  # fails if another process made the run meanwhile: no two writers
        except BaseException as e:
            lock.release()
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError) and path.exists():
                raise TiecliError(f"run {path.name!r} was created by another process meanwhile") from None
            raise
        return cls(path, lock)

    def close(self) -> None:
        """Close the listeners, then release the lock: what they write into the run is complete before."""
        try:
            for listener in self.listeners:
                listener.close()
        finally:
            self.listeners = []
            self.lock.release()

    def _written(self, kind: str, record: dict) -> None:
        for listener in self.listeners:
            listener.written(kind, record)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def summary(self, summary: Summary) -> None:
        write_json(self.path / SUMMARY, asdict(summary))
        self._written("summary", asdict(summary))

    def rewrite(self, files: dict[str, str]) -> None:
        """Replace text files of the run by name: config.yaml, when --resume extends the run."""
        for name, text in files.items():
            atomic_write(self.path / name, text)

    def log(self, row: MetricsRow) -> None:
        """One line per call, flushed: a reader (a sweep's live table) sees whole lines as they come."""
        try:
            with open(self.path / METRICS, "a", encoding="utf-8") as f:
                f.write(json.dumps(row.to_dict()) + "\n")
        except OSError as e:
            if e.filename is None:  # a failed write (a full disk) names no file: name it
                raise OSError(e.errno, e.strerror, str(self.path / METRICS)) from None
            raise
        self._written("metrics", row.to_dict())

    def geometry(self, entry: GeometryEntry) -> None:
        """Add an entry, replacing one for the same step."""
        entries = [e for e in self.reader.geometry() if e.step != entry.step]
        entries = sorted([*entries, entry], key=lambda e: e.step)
        write_json(self.path / GEOMETRY, {"format": FORMAT, "entries": [e.to_dict() for e in entries]})
        self._written("geometry", entry.to_dict())

    def eval(self, result: EvalResult) -> None:
        """Add a whole-split evaluation to eval.json, under its split, keeping the other splits'."""
        splits = {s: asdict(e) for s, e in self.reader.evals().items()} | {result.split: asdict(result)}
        write_json(self.path / EVAL, {"format": FORMAT, "splits": splits})
        self._written("eval", asdict(result))

    def trackers(self, records: dict) -> None:
        """trackers.json: what the run keeps about its trackers (the W&B run id, for a resume)."""
        write_json(self.path / TRACKERS, {"format": FORMAT, **records})

    def save(self, relative: Path, data: bytes) -> None:
        """A checkpoint file (serialised by the caller) at a path inside the run."""
        atomic_write(self.path / relative, data)

    def keep_checkpoint(self, step: int, keep: int) -> None:
        """Keep last.pt, just written at `step`, as checkpoints/step_N.pt too (a hard link: no second copy on
        disk; a copy where links are not allowed), then remove the oldest kept beyond `keep` (0: all).
        Both are atomic: the link is made under a temporary name and renamed into place."""
        if keep > 0:
            kept, last = self.path / KEPT / f"step_{step}.pt", self.path / CHECKPOINT
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(last, tmp)
                os.replace(tmp, kept)
            except OSError:
                tmp.unlink(missing_ok=True)
                atomic_write(kept, last.read_bytes())
        steps = self.reader.kept_steps()
        for old in steps[: max(0, len(steps) - keep)]:
            (self.path / KEPT / f"step_{old}.pt").unlink(missing_ok=True)

    def row_sample(self, step: int, ids: np.ndarray, input_rows: np.ndarray, output_rows: np.ndarray | None) -> None:
        """rows.npz, replacing the previous step's: token ids and their rows of the input and (when the mode has
        two matrices) the output matrix, as float16, the compact record two runs' matrices are compared by."""
        step_, ids_, input_ = np.array(step, dtype=np.int64), ids.astype(np.int32), input_rows.astype(np.float16)
        buffer = io.BytesIO()
        if output_rows is None:
            np.savez_compressed(buffer, step=step_, ids=ids_, input=input_)
        else:
            np.savez_compressed(buffer, step=step_, ids=ids_, input=input_, output=output_rows.astype(np.float16))
        atomic_write(self.path / ROW_SAMPLE, buffer.getvalue())

    def remove_snapshot(self, step: int) -> None:
        """Delete one step's token-matrix snapshot (train thins them to diag.max_snapshots)."""
        (self.path / SNAPSHOTS / f"step_{step}.pt").unlink(missing_ok=True)

    def keep_restore_point(self) -> None:
        """Before extending a completed run: .undo/ holds a hard link to each of its files as they are now
        (no second copy on disk; a copy where links are not allowed). Every later write replaces a file by
        rename, and metrics.jsonl is rewritten before it is appended to, so the links keep the old bytes."""
        undo = self.path / UNDO
        shutil.rmtree(undo, ignore_errors=True)
        try:
            for path in self._files():
                saved = undo / path.relative_to(self.path)
                saved.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, saved)
                except OSError:
                    shutil.copy2(path, saved)
        except BaseException:
            shutil.rmtree(undo, ignore_errors=True)
            raise

    def has_restore_point(self) -> bool:
        return (self.path / UNDO).is_dir()

    def drop_restore_point(self) -> None:
        shutil.rmtree(self.path / UNDO, ignore_errors=True)

    def undo(self) -> None:
        """Put the run back as keep_restore_point found it: files added since go, the saved ones come back
        by rename, which needs no free space (a full disk is the usual reason to undo). Listeners close first."""
        for listener in self.listeners:
            listener.close()
        self.listeners = []
        undo = self.path / UNDO
        saved = {p.relative_to(undo) for p in undo.rglob("*") if p.is_file()}
        for path in self._files():
            if path.relative_to(self.path) not in saved:
                path.unlink(missing_ok=True)
        for relative in saved:
            (self.path / relative).parent.mkdir(parents=True, exist_ok=True)
            os.replace(undo / relative, self.path / relative)
        shutil.rmtree(undo, ignore_errors=True)

    def _files(self) -> list[Path]:
        """Every file of the run but its lock and the restore point."""
        return [
            p
            for p in self.path.rglob("*")
            if p.is_file() and p.name != LOCK and UNDO not in p.relative_to(self.path).parts
        ]

    def truncate_after(self, last_step: int) -> None:
        """Forget what the run recorded after last_step (-1: everything): a resume is about to redo it."""
        for listener in self.listeners:
            listener.truncated(last_step)
        rows = [r for r in self.reader.metrics() if r.step <= last_step]
        header = json.dumps({"format": FORMAT}) + "\n"
        atomic_write(self.path / METRICS, header + "".join(json.dumps(r.to_dict()) + "\n" for r in rows))
        if (self.path / GEOMETRY).exists():
            kept = [e.to_dict() for e in self.reader.geometry() if e.step <= last_step]
            write_json(self.path / GEOMETRY, {"format": FORMAT, "entries": kept})
        for step in self.reader.snapshot_steps():
            if step > last_step:
                (self.path / SNAPSHOTS / f"step_{step}.pt").unlink()
        for step in self.reader.kept_steps():
            if step > last_step:
                (self.path / KEPT / f"step_{step}.pt").unlink()
        sample = self.reader.row_sample()
        if sample is not None and sample[0] > last_step:
            (self.path / ROW_SAMPLE).unlink()
        if last_step < 0:
            (self.path / EVAL).unlink(missing_ok=True)


def discard_unstarted(path: Path) -> bool:
    """Remove a run that trained no step (it failed, or was stopped, before its first), so a plain
    re-run may take its name; False, touching nothing, when it holds anything worth keeping."""
    reader = RunReader(path)
    try:
        summary = reader.summary()
    except FormatError:
        return False
    if summary.status not in ("failed", "interrupted") or summary.step > 0:
        return False
    with Lock(path / LOCK, f"run {path.name}"):
        shutil.rmtree(path)
    return True
