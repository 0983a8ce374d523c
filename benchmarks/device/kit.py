# Used by benchmarks/gpu_check.py and benchmarks/device/study.py: one device call's clock and the files it returns.
"""What every phase of the device kit shares: a global deadline, JSON written atomically after each
phase, run directories packed without their checkpoints, and the device tool's limits on what comes
back from $OUT (at most 8 files, each under 16 MB, at most 2 folders down)."""

import io
import json
import os
import re
import tarfile
import time
from pathlib import Path

MAX_FILES = 8  # what the device tool returns from $OUT (/work/.library/device/README.md, Limits)
MAX_FILE_BYTES = 16 * 2**20
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class Deadline:
    """One clock for a whole device call: each phase gets what is left, minus a margin for writing."""

    def __init__(self, seconds: float, margin: float = 15.0):
        self.end, self.margin = time.monotonic() + seconds, margin

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic() - self.margin)

    def timeout(self, want: float) -> float:
        """A subprocess's timeout: what it wants, or what is left, whichever is less."""
        return max(1.0, min(want, self.left()))


def write_json(path: Path, obj: object) -> None:
    """obj as JSON, written to a temporary file and renamed: a call killed mid-write leaves the last whole one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def pack_runs(runs: Path, out: Path, limit: int = MAX_FILE_BYTES) -> int:
    """runs/ as one tar.xz, without checkpoints (*.pt): metrics, summary, eval, geometry, config, logs.
    Largest files are left out first when the archive would pass `limit`; returns the files packed."""
    files = sorted((p for p in runs.rglob("*") if p.is_file() and p.suffix != ".pt"), key=lambda p: p.stat().st_size)
    while True:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(runs)))
        if buffer.tell() < limit or not files:
            break
        files = files[:-1]  # the largest: a log or geometry file, never worth losing the rest for
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, out)
    return len(files)


def returned_problems(out: Path) -> list[str]:
    """What in `out` the device tool would not return: too many files, a file too large, too deep, a bad name."""
    files = [p for p in out.rglob("*") if p.is_file()]
    problems = [f"{len(files)} files, more than {MAX_FILES}"] if len(files) > MAX_FILES else []
    for p in files:
        rel = p.relative_to(out)
        if p.stat().st_size >= MAX_FILE_BYTES:
            problems.append(f"{rel}: {p.stat().st_size:,} bytes, not under {MAX_FILE_BYTES:,}")
        if len(rel.parts) > 3:
            problems.append(f"{rel}: more than 2 folders down")
        if not all(NAME.match(part) for part in rel.parts):
            problems.append(f"{rel}: a name with characters other than letters, digits, '.', '_', '-'")
    return problems
