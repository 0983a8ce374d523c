# Used by benchmarks/gpu_check.py and benchmarks/device/study.py: one device call's clock and the files it returns.
"""What every phase of the device kit shares: a global deadline, JSON written atomically after each
phase, run directories packed without their checkpoints, and the device tool's limits on what comes
back from $OUT (at most 8 files, each under 16 MB, at most 2 folders down)."""

import io
import json
import os
import re
import signal
import sys
import tarfile
import time
from collections.abc import Callable
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


class PastDeadline(Exception):
    """An in-process phase ran past the deadline."""


def guarded(check: str, fn: Callable[[], list[dict]], deadline: Deadline, least: float = 20) -> list[dict]:
    """fn's rows, or one failed row with its error: one failing check still leaves the others' figures.
    Not started with less than `least` seconds left (a skipped row); stopped by an alarm at the deadline."""
    if deadline.left() < least:
        return [{"check": check, "ok": None, "skipped": f"{deadline.left():.0f} s left, wanted {least:.0f}"}]

    def alarm(signum, frame):
        raise PastDeadline(f"stopped at the deadline after {time.perf_counter() - start:.0f} s")

    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(deadline.left())))
    try:
        rows = fn()
    except (Exception, PastDeadline) as e:
        rows = [{"check": check, "ok": False, "error": " ".join(f"{type(e).__name__}: {e}".split())[-600:]}]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    rows[-1]["wall_s"] = round(time.perf_counter() - start, 1)
    return rows


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


def travel_bytes(repo: Path, carried: list[Path]) -> dict[str, int]:
    """What a device call sends, in bytes: the tracked files and the untracked ones git does not ignore
    (as they are on disk), and the carried paths; the device tool's limit is 64 MiB for all together."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    tree = sum((repo / os.fsdecode(p)).stat().st_size for p in listed if p and (repo / os.fsdecode(p)).is_file())
    carry = sum(f.stat().st_size for path in carried for f in [path, *path.rglob("*")] if f.is_file())
    return {"tree": tree, "carry": carry, "total": tree + carry}


TRAVEL_LIMIT = 64 * 2**20


def main(argv: list[str]) -> int:
    """`python kit.py size CARRY...`: what a call sends; `python kit.py verify DIR`: what DIR returns."""
    if argv[:1] == ["size"]:
        sizes = travel_bytes(Path.cwd(), [Path(p) for p in argv[1:]])
        mib = {k: v / 2**20 for k, v in sizes.items()}
        print(f"travels: tracked and untracked tree {mib['tree']:.1f} MiB + carried {mib['carry']:.1f} MiB")
        print(f"= {mib['total']:.1f} MiB of the device tool's 64 MiB")
        return 0 if sizes["total"] < TRAVEL_LIMIT else 1
    if argv[:1] == ["verify"] and len(argv) == 2:
        problems = returned_problems(Path(argv[1]))
        print("\n".join(problems) or f"{argv[1]}: every file comes back")
        return 1 if problems else 0
    print("usage: python kit.py size CARRIED... | python kit.py verify DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
