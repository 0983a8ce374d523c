# Used by `tiecli sweep` (the live table, or a line per change without a terminal) and `tiecli sweep --status`.
"""What a sweep's jobs are doing: step, losses and time left, read from their run directories.

In a terminal the sweep shows a live table of its jobs; without one (a log file, CI) it prints a
line per state change and, for each running job, a progress line at most every PLAIN_EVERY_S
seconds. `--status` prints the same table once, from sweep.json, the run directories and the
launcher's view of jobs still queued or running.
"""

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import cast

from rich.console import Console, JustifyMethod
from rich.table import Table

from tiecli.config.naming import check_name
from tiecli.errors import TiecliError
from tiecli.formats import duration, num
from tiecli.run.layout import MANIFEST, run_path
from tiecli.run.reader import RunReader
from tiecli.run.records import SweepJob, SweepManifest, read_manifest
from tiecli.sweep.launchers import still_active
from tiecli.sweep.states import current_state, last_error_line, read_live

STATE_STYLES = {"pending": "dim", "running": "yellow", "completed": "green", "failed": "red", "interrupted": "magenta"}


PROGRESS_EVERY_S = 5.0  # a step that runs longer than this says how far it has come, at most this often


class Ticker:
    """Says how far a long step with nothing else to show has come ("composing jobs: 1,200 of 6,000"), at most
    every PROGRESS_EVERY_S seconds and first after that long, so a short step prints nothing."""

    def __init__(self, console: Console, what: str, clock: Callable[[], float] = time.monotonic):
        self.console, self.what, self.clock = console, what, clock
        self.next = clock() + PROGRESS_EVERY_S

    def __call__(self, done: int, total: int) -> None:
        if done < total and self.clock() >= self.next:
            self.console.print(f"{self.what}: {done:,} of {total:,} ...", highlight=False, markup=False)
            self.next = self.clock() + PROGRESS_EVERY_S


def show_status(runs_dir: Path, name: str, console: Console) -> None:
    """`tiecli sweep --status NAME`: the jobs table and the counts, from sweep.json, the run directories and the
    launcher's view of jobs still queued or running; submits and writes nothing."""
    check_name(name, sweep=True)
    sweep_dir = run_path(Path(runs_dir) / "sweeps", name)
    if not (sweep_dir / MANIFEST).exists():
        known = sorted(p.parent.name for p in (Path(runs_dir) / "sweeps").glob(f"*/{MANIFEST}"))
        raise TiecliError(
            f"no sweep {name!r} in {str(Path(runs_dir) / 'sweeps')!r}; sweeps there: {', '.join(known) or 'none'}"
        )
    manifest = read_manifest(sweep_dir / MANIFEST)
    for job in manifest.jobs:
        live = job.state == "running" and (
            still_active(job.job_id, sweep_dir) or RunReader(sweep_dir / job.run_dir).in_use()
        )
        job.state = "running" if live else current_state(job, sweep_dir)
    console.print(jobs_table(manifest.jobs, Watch(sweep_dir)))
    show_counts(console, manifest, sweep_dir)


def show_counts(console: Console, manifest: SweepManifest, sweep_dir: Path) -> dict[str, int]:
    """The line that ends a sweep and `--status`: how many jobs are in each state; those counts."""
    counts = {s: sum(j.state == s for j in manifest.jobs) for s in STATE_STYLES}
    console.print(
        f"sweep {manifest.name!r} in {shown(sweep_dir)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return counts


def progress(run_dir: Path) -> dict:
    """Step, losses and where this attempt began (step, time; None unless running), from the run's files."""
    reader = RunReader(run_dir)
    summary = read_live(reader.summary, None)
    rows = read_live(reader.metrics, [])
    step = rows[-1].step if rows else summary.step if summary else 0
    loss = next((r.loss for r in reversed(rows) if r.loss is not None), None)
    final = (summary.final_val or {}).get("loss") if summary else None
    val_loss = final or next((r.val_loss for r in reversed(rows) if r.val_loss is not None), None)
    # summary.json is written at the start of each attempt: its step and time are where the attempt began.
    running = summary and summary.status == "running"
    start = (summary.step, datetime.fromisoformat(summary.started).timestamp()) if running else None
    return {
        "step": step,
        "max_steps": summary.max_steps if summary else None,
        "loss": loss,
        "val_loss": val_loss,
        "start": start,
        "eta": None,
    }


def eta(points: list[tuple[int, float]], max_steps: int, now: float) -> float | None:
    """Seconds left: the pace from the first to the last (step, time) point, less the time since the last (at least 0).

    Between two logged steps the estimate counts down; the next logged step corrects the pace. None without a pace.
    """
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    (first, t_first), (last, t_last) = points[0], points[-1]
    return max(0.0, (t_last - t_first) / (last - first) * (max_steps - last) - (now - t_last))


class Watch:
    """What each job is doing, for the live table and the plain lines; a job's files are read again while it runs."""

    def __init__(
        self, sweep_dir: Path, clock: Callable[[], float] = time.time, gpus: dict[str, str | None] | None = None
    ):
        self.sweep_dir, self.clock = sweep_dir, clock
        self.gpus = gpus if gpus is not None else {}  # job name -> CUDA_VISIBLE_DEVICES of its running attempt
        self.cache: dict[tuple[str, str, int], dict] = {}  # (name, state, attempt) -> progress
        # (name, attempt) -> [(step, time)]: the first and the latest logged step seen, and when
        self.seen: dict[tuple[str, int], list[tuple[int, float]]] = {}

    def progress(self, job: SweepJob) -> dict:
        key = (job.name, job.state, job.attempts)
        if job.state == "running" or key not in self.cache:
            p = progress(self.sweep_dir / job.run_dir)
            if job.state == "running" and p["start"] and p["max_steps"]:
                p["eta"] = self._eta(self.seen.setdefault((job.name, job.attempts), []), p)
            self.cache[key] = p
        return self.cache[key]

    def _eta(self, seen: list[tuple[int, float]], p: dict) -> float | None:
        """The pace between the logged steps seen; until there are two, from the attempt's start (start-up included)."""
        now = self.clock()
        if p["step"] > p["start"][0] and (not seen or seen[-1][0] != p["step"]):
            del seen[1:]
            seen.append((p["step"], now))
        return eta(seen if len(seen) > 1 else [p["start"], *seen], p["max_steps"], now)


class PlainProgress:
    """Without a terminal: a line per running job at most every `every` seconds, and only when its step moved."""

    def __init__(
        self,
        console: Console,
        watch: Watch,
        jobs: list[SweepJob],
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.console, self.watch, self.jobs, self.every, self.clock = console, watch, jobs, every, clock
        self.last: dict[tuple[str, int], tuple[float, int]] = {}  # (name, attempt) -> (when last read, the step then)

    def tick(self, running: list[SweepJob]) -> None:
        now = self.clock()
        for job in running:
            read_at, step = self.last.setdefault((job.name, job.attempts), (now, 0))
            if now - read_at < self.every:
                continue
            p = self.watch.progress(job)
            self.last[(job.name, job.attempts)] = (now, p["step"])
            if p["step"] != step:
                number = f"[{self.jobs.index(job) + 1}/{len(self.jobs)}]"
                self.console.print(
                    f"{number} {job.name}: step {p['step']}/{p['max_steps']} loss {num(p['loss'])} "
                    f"val {num(p['val_loss'])} ETA {duration(p['eta'])}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )


def jobs_table(jobs: list[SweepJob], watch: Watch) -> Table:
    """The live table (and `--status`'s): a job id column when a cluster launcher gave ids, a GPU column when
    jobs were given GPUs."""
    table = Table(title=f"sweep {watch.sweep_dir.name}")
    ids, gpus = any(j.job_id for j in jobs), any(watch.gpus.values())
    columns = ["job", "state", *(["job id"] if ids else []), *(["GPU"] if gpus else [])]
    for column in [*columns, "step", "loss", "val loss", "ETA"]:
        justify = cast(JustifyMethod, "left" if column in columns else "right")
        table.add_column(column, justify=justify, overflow="fold" if column == "job" else "ellipsis")
    for job in jobs:
        p = watch.progress(job)
        steps = f"{p['step']}/{p['max_steps']}" if p["max_steps"] else "-"
        eta = duration(p["eta"]) if p["eta"] is not None else "-"
        where = ([job.job_id or "-"] if ids else []) + ([watch.gpus.get(job.name) or "-"] if gpus else [])
        state = f"[{STATE_STYLES[job.state]}]{job.state}[/]"
        table.add_row(job.name, state, *where, steps, num(p["loss"], ".4f"), num(p["val_loss"], ".4f"), eta)
    return table


def announce(console: Console, job: SweepJob, jobs: list[SweepJob], sweep_dir: Path, gpus: str | None) -> None:
    """Without a terminal (a log file, CI) there is no live table: one line per state change instead."""
    if console.is_terminal:
        return
    number = f"[{jobs.index(job) + 1}/{len(jobs)}]"
    detail = ""
    if job.state == "running":
        where = (f", job {job.job_id}" if job.job_id else "") + (f", GPU {gpus}" if gpus else "")
        detail = f" (attempt {job.attempts}{where})"
    elif job.state == "completed":
        p = progress(sweep_dir / job.run_dir)
        detail = f" at step {p['step']}, val loss {num(p['val_loss'], '.4f')}"
    elif job.state == "failed":
        detail = f" (exit {job.exit_code}): {last_error_line(job)}"
    elif job.state == "interrupted":
        detail = f" at step {progress(sweep_dir / job.run_dir)['step']}"
    console.print(f"{number} {job.name}: {job.state}{detail}", highlight=False, markup=False, soft_wrap=True)


def shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
