# Used by `tiecli sweep`: expand a grid of overrides, run each job as its own `tiecli train` process.
"""A sweep: the Cartesian product of Hydra sweep overrides, run job by job, resumable.

runs/sweeps/<name>/
  sweep.json     the manifest: command, axes, fixed overrides and every job's state, rewritten
                 atomically after each change, so it is true whenever the sweep stops
  logs/<job>.log each job's stdout and stderr, every attempt appended (a job that fails before it
                 creates its run directory still has something to say)
  <job>/         each job's run directory, named by config.run_name, written by `tiecli train`
  .lock          held (flock) by the sweep while it runs: one sweep at a time per folder

A job's run_dir and log in sweep.json are relative to the sweep folder, so the folder can move.

Each job is a separate process: a crash or an out-of-memory kill ends that job, not the sweep;
the sweep's death (even kill -9) stops its jobs, which checkpoint first (Linux).
Re-running the same sweep skips completed runs (their summary.json says so), resumes interrupted
ones from their checkpoint and retries failed ones. A re-run may add jobs (more seeds, a new mode)
but not drop any: the manifest always describes every run in the folder.
"""

import contextlib
import ctypes
import dataclasses
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import yaml
from rich.console import Console, JustifyMethod
from rich.live import Live
from rich.table import Table

from tiecli import config, rundir
from tiecli.display import PLAIN_EVERY_S, duration, num
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import count_params

MANIFEST = "sweep.json"
SAFE_NAME = re.compile(f"[{config.NAME_CHARS}]+")
SAFE_VALUE = re.compile(r"[A-Za-z0-9._]+")  # a value shown as is in a default name: '-' separates them there
NAME_LENGTH = 40
BYTES_PER_PARAM = 4  # fp32 weights, also under bf16 autocast
STUDY_KEYS = ("description", "axes", "fixed")
STATE_STYLES = {"pending": "dim", "running": "yellow", "completed": "green", "failed": "red", "interrupted": "magenta"}
ERROR_TAIL_LINES = 5
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- expanding the overrides into jobs ---------------------------------------------------------


def load_study(name: str, dirs: list[Path]) -> tuple[str, list[str]]:
    """conf/study/NAME.yaml (the first config dir that has it): its description and its command-line overrides."""
    path = next((d / "study" / f"{name}.yaml" for d in dirs if (d / "study" / f"{name}.yaml").is_file()), None)
    if path is None:
        raise ConfigError(
            f"unknown study {name!r}; valid studies: {', '.join(config.group_options('study', dirs)) or 'none'}"
        )
    try:
        study = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if (
        not isinstance(study, dict)
        or set(study) - set(STUDY_KEYS)
        or not all(isinstance(study.get(k) or {}, dict) for k in ("axes", "fixed"))
    ):
        raise ConfigError(
            f"{str(path)!r}: a study is a mapping with description, axes (key: [values]) and fixed (key: value)"
        )
    axes = [
        f"{k}={','.join(map(_value, v)) if isinstance(v, list) else _value(v)}"
        for k, v in (study.get("axes") or {}).items()
    ]
    fixed = [f"{k}={_value(v)}" for k, v in (study.get("fixed") or {}).items()]
    for line in fixed:
        if any(o.is_sweep_override() for o in config.parse_overrides([line])):
            raise ConfigError(f"study {name!r}: fixed setting {line!r} has several values; move it under axes")
    return str(study.get("description") or ""), axes + fixed


def _value(v) -> str:
    """A YAML value as it would be typed on the command line."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def expand(overrides: list[str], dirs: list[Path]) -> tuple[dict | None, list[tuple[str, list[str]]]]:
    """The study (name and description, or None) and, in order, each key with the override lines it takes (one if fixed).

    Command-line overrides replace a study's axis or setting with the same key, in its place.
    """
    parsed = config.parse_overrides(overrides)
    config.check_unique(parsed, "on the command line")
    study = next((o for o in parsed if o.key_or_group == "study"), None)
    if study is not None and study.is_sweep_override():
        raise ConfigError(f"{study.input_line!r}: run one study at a time")
    entries, about = {}, None
    if study is not None:
        about = {"name": str(study.value())}
        about["description"], study_lines = load_study(about["name"], dirs)
        study_overrides = config.parse_overrides(study_lines)
        config.check_unique(study_overrides, f"in study {about['name']!r}")
        entries = {o.key_or_group: o for o in study_overrides}
    entries.update({o.key_or_group: o for o in parsed if o is not study})
    return about, [(key, _lines(o, dirs)) for key, o in entries.items()]


def _lines(o, dirs: list[Path]) -> list[str]:
    """The override lines one override stands for: itself, or one per value of its sweep."""
    if not o.is_sweep_override():
        return [o.input_line]
    if not o.is_discrete_sweep():
        raise ConfigError(f"{o.input_line!r} is not a list of values; use a,b,c, range(start,stop[,step]) or glob(...)")
    # glob() asks a config loader for the group's options; tiecli's own listing covers --config-dir too.
    o.config_loader = SimpleNamespace(
        get_group_options=lambda group, results_filter=None: config.group_options(group, dirs)
    )
    values = list(o.sweep_string_iterator())
    if not values:
        where = (
            f"the {o.key_or_group} options: {', '.join(config.group_options(o.key_or_group, dirs))}"
            if o.key_or_group in config.GROUPS
            else f"a config group ({', '.join(config.GROUPS)})"
        )
        raise ConfigError(f"{o.input_line!r} gives no values; glob() matches against {where}")
    return [f"{o.get_key_element()}={v}" for v in values]


def check_name(name: str) -> None:
    """--name: letters, digits, '.', '_' and '-' only, so the folder can be typed in any shell as is."""
    if not SAFE_NAME.fullmatch(name):
        raise ConfigError(f"--name {name!r} may only hold letters, digits, '.', '_' and '-'")


def default_name(study: str | None, axes: list[tuple[str, list[str]]]) -> str:
    """A shell-safe name (NAME_CHARS, at most NAME_LENGTH characters) for a study and the command line's (key, values).

    The study's name when the command adds nothing; else each key's last part and its values
    (model=nano,micro seed=0,1 -> model-nano-micro_seed-0-1) when that fits and says everything
    (every key swept, values that need no escaping); else the keys and a hash of the overrides.
    """
    study_part = [study] if study else []
    shorts = [key.rsplit(".", 1)[-1] for key, _ in axes]
    name = "_".join(study_part + [f"{short}-{'-'.join(values)}" for short, (_, values) in zip(shorts, axes)]) or "sweep"
    plain = all(len(values) > 1 and all(map(SAFE_VALUE.fullmatch, values)) for _, values in axes)
    if plain and len(set(shorts)) == len(shorts) and SAFE_NAME.fullmatch(name) and len(name) <= NAME_LENGTH:
        return name
    digest = hashlib.sha256(json.dumps([study, axes]).encode()).hexdigest()[:8]
    stem = re.sub(f"[^{config.NAME_CHARS}]", "_", "-".join(study_part + shorts))
    return f"{stem[: NAME_LENGTH - 9]}-{digest}" if stem else digest


def plan(
    overrides: list[str], config_dir: Path | None, runs_dir: Path, name: str | None
) -> tuple[Path, rundir.SweepManifest, dict[str, config.Config]]:
    """The sweep folder, its manifest and each job's checked Config (by job name); every job is composed first.

    Writes nothing.
    """
    if name is not None:
        check_name(name)
    dirs = config.config_dirs(config_dir)
    study, entries = expand(overrides, dirs)
    jobs, configs = [], {}
    for combo in itertools.product(*(lines for _, lines in entries)):
        cfg, choices = config.compose(list(combo), config_dir)
        job_name = config.run_name(choices, cfg, list(combo))
        configs[job_name] = config.to_config(cfg)  # a bad value in any job stops the sweep before anything runs
        jobs.append(rundir.SweepJob(name=job_name, overrides=list(combo), run_dir=job_name, log=f"logs/{job_name}.log"))
    names = [j.name for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ConfigError(f"two jobs would share the run directory {twice!r}; a value is repeated in the sweep")

    values = {key: [line.split("=", 1)[1] for line in lines] for key, lines in entries}
    given = [o.key_or_group for o in config.parse_overrides(overrides) if o.key_or_group != "study"]
    sweep_name = name or default_name(study["name"] if study else None, [(key, values[key]) for key in given])
    sweep_dir = rundir.run_path(Path(runs_dir) / "sweeps", sweep_name)
    command = ["tiecli", "sweep", *overrides, "--name", sweep_name, "--runs-dir", str(runs_dir)]
    command += ["--config-dir", str(config_dir)] if config_dir else []
    manifest = rundir.SweepManifest(
        name=sweep_name,
        created=now(),
        updated=now(),
        command=shlex.join(command),
        config_dir=str(dirs[0]) if config_dir else None,
        study=study,
        axes={key: v for key, v in values.items() if len(v) > 1},
        fixed=[lines[0] for _, lines in entries if len(lines) == 1],
        jobs=jobs,
    )
    if (sweep_dir / MANIFEST).exists():
        manifest = _merge(rundir.read_manifest(sweep_dir / MANIFEST), manifest)
    return sweep_dir, manifest, configs


def _merge(old: rundir.SweepManifest, new: rundir.SweepManifest) -> rundir.SweepManifest:
    """The new command's manifest, keeping what the old one knew about the same jobs.

    Adding jobs is allowed (more seeds, a new mode); dropping some is refused, so the manifest
    never stops describing a run that sits in its folder.
    """
    known = {j.name: j for j in old.jobs}
    dropped = sorted(known.keys() - {j.name for j in new.jobs})
    if dropped:
        raise TiecliError(
            f"sweep {new.name!r} already has {len(dropped)} job(s) this command leaves out (e.g. {dropped[0]!r}); "
            f"re-run it with the same overrides (`{old.command}`) or pick another --name"
        )
    history = ("state", "exit_code", "error", "started", "ended", "attempts")
    jobs = [
        dataclasses.replace(job, **{k: getattr(known[job.name], k) for k in history}) if job.name in known else job
        for job in new.jobs
    ]
    return dataclasses.replace(new, created=old.created, jobs=jobs)


# --- running the jobs -------------------------------------------------------------------------------


def run(
    sweep_dir: Path, manifest: rundir.SweepManifest, parallel: int, console: Console, every: float = PLAIN_EVERY_S
) -> int:
    """Run every job not yet completed, `parallel` at a time; returns the exit code (0, 1 or 130).

    Without a terminal, each running job gets a progress line at most every `every` seconds.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # Two sweeps training the same runs would corrupt them. A lock, not a pid in the manifest: the OS
    # drops it when the sweep dies, so it never outlives the sweep nor mistakes another process for it.
    with rundir.Lock(sweep_dir / rundir.LOCK, f"sweep {manifest.name}"):
        manifest, todo = _prepare(sweep_dir, manifest, console)
        stopped = _run_jobs(sweep_dir, manifest, todo, parallel, console, every)
    return _conclude(console, manifest, sweep_dir, stopped)


def _prepare(
    sweep_dir: Path, manifest: rundir.SweepManifest, console: Console
) -> tuple[rundir.SweepManifest, list[rundir.SweepJob]]:
    """Under the sweep's lock: the manifest as it stands now, each job's state from its run, and the jobs to run."""
    old = rundir.read_manifest(sweep_dir / MANIFEST) if (sweep_dir / MANIFEST).exists() else None
    if old:  # plan() read it before the lock was ours: a sweep that ended meanwhile may have changed it
        manifest = _merge(old, manifest)
    for job in manifest.jobs:
        # The run directory is the truth: a run deleted since, or a sweep killed outright, shows up here.
        status = _status(sweep_dir / job.run_dir)
        if status == "completed":
            job.state = "completed"
        elif job.state in ("running", "completed"):
            job.state = "interrupted" if status else "pending"
    todo = [j for j in manifest.jobs if j.state != "completed"]
    for job in todo:
        _check_free(sweep_dir / job.run_dir, job.name, manifest.name)
    if old and len(manifest.jobs) > len(old.jobs):
        console.print(
            f"sweep {manifest.name!r}: {len(manifest.jobs) - len(old.jobs)} new job(s) added to the {len(old.jobs)} in its manifest"
        )
    if len(todo) < len(manifest.jobs):
        console.print(f"{len(manifest.jobs) - len(todo)} of {len(manifest.jobs)} jobs already completed; skipping them")
    return manifest, todo


def _check_free(run_dir: Path, name: str, sweep: str) -> None:
    """Refuse a run another process is writing (a trainer a killed sweep left, a `tiecli train --resume`): a second trainer would corrupt it."""
    if rundir.RunReader(run_dir).in_use():
        try:  # taking the lock fails naming its holder, as a second `tiecli train` would; if it was just freed, fine
            rundir.Lock(run_dir / rundir.LOCK, f"run {name}").acquire().release()
        except TiecliError as e:
            raise TiecliError(f"sweep {sweep}: {e}") from None


def _run_jobs(
    sweep_dir: Path,
    manifest: rundir.SweepManifest,
    todo: list[rundir.SweepJob],
    parallel: int,
    console: Console,
    every: float,
) -> bool:
    """Launch and reap the jobs, saving the manifest at every change; returns whether a signal stopped the sweep."""
    jobs = manifest.jobs

    def save() -> None:
        manifest.updated = now()
        rundir.write_manifest(sweep_dir / MANIFEST, manifest)

    running: dict[
        str, tuple[subprocess.Popen, int]
    ] = {}  # job name -> (process, where this attempt starts in the job's log)
    signals = []  # the handler only records; the loop forwards, so a job launched meanwhile is not missed
    stopped = 0
    save()
    previous = {
        s: signal.signal(s, lambda signum, frame: signals.append(signum))
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    watch = Watch(sweep_dir)
    plain = None if console.is_terminal else PlainProgress(console, watch, jobs, every)
    live = Live(get_renderable=lambda: jobs_table(jobs, watch), console=console, refresh_per_second=4, transient=True)
    try:
        with live if console.is_terminal else contextlib.nullcontext():
            while (todo and not signals) or running:
                if len(signals) > stopped:
                    stopped = len(signals)
                    _stop(console, [proc for proc, _ in running.values()], hard=stopped > 1)
                while todo and len(running) < parallel and not signals:
                    job = todo.pop(0)
                    running[job.name] = _launch(job, sweep_dir, manifest.config_dir, parallel)
                    save()
                    _announce(console, job, jobs, sweep_dir)
                for job in [j for j in jobs if j.name in running]:
                    proc, offset = running[job.name]
                    if proc.poll() is None:
                        continue
                    del running[job.name]
                    _finish(job, proc.returncode, bool(signals), sweep_dir / job.log, offset)
                    save()
                    _announce(console, job, jobs, sweep_dir)
                if plain:
                    plain.tick([j for j in jobs if j.name in running])
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for proc, _ in running.values():  # only after an error in the sweep itself: stop the orphans cleanly
            proc.send_signal(signal.SIGINT)
    save()
    if console.is_terminal:
        console.print(jobs_table(jobs, watch))
    return bool(signals)


def _stop(console: Console, procs: list[subprocess.Popen], hard: bool) -> None:
    """First Ctrl-C: each job saves a checkpoint and exits 130. Second: kill them (they resume from the last one)."""
    # Jobs run in their own session, so a terminal's Ctrl-C reaches the sweep only and each job gets exactly one.
    for proc in procs:
        if hard:
            proc.kill()
        else:
            proc.send_signal(signal.SIGINT)
    console.print(
        "killing the running jobs"
        if hard
        else f"stopping: {len(procs)} running job(s) save a checkpoint and stop (Ctrl-C again kills them)"
    )


def _read(read, default):
    """A run's file while `tiecli train` may be writing it: absent or unreadable for now reads as `default`."""
    try:
        return read()
    except TiecliError:
        return default


def _status(run_dir: Path) -> str | None:
    return _read(rundir.RunReader(run_dir).status, None)


def _stop_with_sweep() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send the job SIGTERM when the sweep dies, even by kill -9.

    Jobs run in their own session, so nothing else would stop them: an orphan would train on, and
    a re-run would find its run in use. SIGTERM makes `tiecli train` checkpoint and stop. None
    (nothing to do) on other systems. A preexec_fn is unsafe in a threaded process (the live
    table's) only if it takes a lock another thread may hold; this one calls prctl and getppid.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl  # looked up here: between fork and exec the child only calls it
    sweep = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != sweep:  # the sweep died before prctl: no signal will come, stop now
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _launch(
    job: rundir.SweepJob, sweep_dir: Path, config_dir: str | None, parallel: int
) -> tuple[subprocess.Popen, int]:
    run_dir = sweep_dir / job.run_dir
    command = [sys.executable, "-m", "tiecli", "train", "--runs-dir", str(sweep_dir), "--name", job.name]
    command += ["--resume"] if rundir.is_run_dir(run_dir) else []
    command += ["--config-dir", config_dir] if config_dir else []
    command += ["--", *job.overrides]  # "--": an override can never be read as an option
    log_path = sweep_dir / job.log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n# attempt {job.attempts + 1}, {now()}: {shlex.join(command[1:])}\n")
        log.flush()
        offset = log.tell()
        # N jobs at once share the CPU: torch's default of one thread per core each would oversubscribe it.
        env = {"COLUMNS": "200", **os.environ}  # job logs are files: rich would wrap them at 80 columns
        if parallel > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // parallel))
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_stop_with_sweep(),
        )
    job.state, job.attempts, job.started = "running", job.attempts + 1, now()
    job.ended = job.exit_code = job.error = None
    return proc, offset


def _finish(job: rundir.SweepJob, code: int, stopping: bool, log_path: Path, offset: int) -> None:
    """The job's state from its exit code: 0 completed, 130 (or stopped by us) interrupted, else failed."""
    if code == 0:
        state = "completed"
    elif stopping or code in (130, -signal.SIGINT):
        state = "interrupted"
    else:
        state = "failed"
    job.state, job.exit_code, job.ended = state, code, now()
    job.error = _tail(log_path, offset) if state == "failed" else None


def _tail(log_path: Path, offset: int) -> str:
    """The last lines this attempt wrote: the error, or the end of a traceback."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return "\n".join(lines[-ERROR_TAIL_LINES:]) or "(no output)"


def _last_error_line(job: rundir.SweepJob) -> str:
    lines = (job.error or "").splitlines()
    return next(
        (line for line in reversed(lines) if line.startswith("error:")),
        lines[-1] if lines else f"exit code {job.exit_code}",
    )


def _announce(console: Console, job: rundir.SweepJob, jobs: list[rundir.SweepJob], sweep_dir: Path) -> None:
    """Without a terminal (a log file, CI) there is no live table: one line per state change instead."""
    if console.is_terminal:
        return
    number = f"[{jobs.index(job) + 1}/{len(jobs)}]"
    detail = ""
    if job.state == "running":
        detail = f" (attempt {job.attempts})"
    elif job.state == "completed":
        p = progress(sweep_dir / job.run_dir)
        detail = f" at step {p['step']}, val loss {num(p['val_loss'], '.4f')}"
    elif job.state == "failed":
        detail = f" (exit {job.exit_code}): {_last_error_line(job)}"
    elif job.state == "interrupted":
        detail = f" at step {progress(sweep_dir / job.run_dir)['step']}"
    console.print(f"{number} {job.name}: {job.state}{detail}", highlight=False, markup=False, soft_wrap=True)


def _conclude(console: Console, manifest: rundir.SweepManifest, sweep_dir: Path, stopped: bool) -> int:
    jobs = manifest.jobs
    counts = {s: sum(j.state == s for j in jobs) for s in STATE_STYLES}
    console.print(
        f"sweep {manifest.name!r} in {_shown(sweep_dir)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    for job in jobs:
        if job.state == "failed":
            console.print(
                f"failed: {job.name}: {_last_error_line(job)} (log: {_shown(sweep_dir / job.log)})",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    if counts["completed"] == len(jobs):
        return 0
    if stopped:
        console.print(
            f"interrupted; run `{manifest.command}` again to continue", highlight=False, markup=False, soft_wrap=True
        )
        return 130
    return 1


# --- what the jobs are doing -----------------------------------------------------------------------


def progress(run_dir: Path) -> dict:
    """Step, losses and where this attempt began (step, time; None unless running), from the run's files."""
    reader = rundir.RunReader(run_dir)
    summary = _read(reader.summary, None)
    rows = _read(reader.metrics, [])
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

    def __init__(self, sweep_dir: Path, clock: Callable[[], float] = time.time):
        self.sweep_dir, self.clock = sweep_dir, clock
        self.cache: dict[tuple[str, str, int], dict] = {}  # (name, state, attempt) -> progress
        # (name, attempt) -> [(step, time)]: the first and the latest logged step seen, and when
        self.seen: dict[tuple[str, int], list[tuple[int, float]]] = {}

    def progress(self, job: rundir.SweepJob) -> dict:
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
        jobs: list[rundir.SweepJob],
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.console, self.watch, self.jobs, self.every, self.clock = console, watch, jobs, every, clock
        self.last: dict[tuple[str, int], tuple[float, int]] = {}  # (name, attempt) -> (when last read, the step then)

    def tick(self, running: list[rundir.SweepJob]) -> None:
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


def jobs_table(jobs: list[rundir.SweepJob], watch: Watch) -> Table:
    """The live table."""
    table = Table(title=f"sweep {watch.sweep_dir.name}")
    for column, justify in (
        ("job", "left"),
        ("state", "left"),
        ("step", "right"),
        ("loss", "right"),
        ("val loss", "right"),
        ("ETA", "right"),
    ):
        table.add_column(
            column, justify=cast(JustifyMethod, justify), overflow="fold" if column == "job" else "ellipsis"
        )
    for job in jobs:
        p = watch.progress(job)
        steps = f"{p['step']}/{p['max_steps']}" if p["max_steps"] else "-"
        eta = duration(p["eta"]) if p["eta"] is not None else "-"
        state = f"[{STATE_STYLES[job.state]}]{job.state}[/]"
        table.add_row(job.name, state, steps, num(p["loss"], ".4f"), num(p["val_loss"], ".4f"), eta)
    return table


def _shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def job_size(cfg: config.Config) -> dict:
    """What one job does and the disk it fills: steps, tokens, evaluations, warmup steps, parameters and bytes.

    The checkpoint holds the weights and AdamW's two moments; each snapshot (diag.snapshots, at step 0 and
    every evaluation, at most diag.max_snapshots) the token matrices. Metrics and geometry files are small.
    """
    counts = count_params(cfg.model)
    snapshots = min(cfg.n_evals + 1, cfg.diag.max_snapshots) if cfg.diag.geometry and cfg.diag.snapshots else 0
    matrices = counts["input_embedding"] + counts["output_matrix"] + counts["shared"]
    checkpoint, snapshot_bytes = counts["total"] * BYTES_PER_PARAM * 3, snapshots * matrices * BYTES_PER_PARAM
    return {
        "steps": cfg.max_steps,
        "tokens": cfg.max_steps * cfg.tokens_per_step,
        "evals": cfg.n_evals,
        "warmup": cfg.warmup,
        "params": counts["total"],
        "checkpoint": checkpoint,
        "snapshots": snapshots,
        "snapshot_bytes": snapshot_bytes,
        "disk": checkpoint + snapshot_bytes,
    }


def size_text(n: int) -> str:
    """Bytes in binary units, as du -h counts them: 1.5 MiB."""
    if n < 1024:
        return f"{n} B"
    exponent = min(4, (n.bit_length() - 1) // 10)
    if exponent < 4 and round(n / 1024**exponent, 1) >= 1024:  # 1023.97 KiB reads 1.0 MiB, not 1024.0 KiB
        exponent += 1
    return f"{n / 1024**exponent:.1f} {('KiB', 'MiB', 'GiB', 'TiB')[exponent - 1]}"


def dry_run_lines(sweep_dir: Path, manifest: rundir.SweepManifest, configs: dict[str, config.Config]) -> list[str]:
    """What `--dry-run` prints: each job's run directory, what running it would do, overrides and size; the total."""
    axes = " x ".join(f"{k} ({len(v)})" for k, v in manifest.axes.items()) or "no axes"
    about = f" ({manifest.study['description']})" if manifest.study and manifest.study["description"] else ""
    lines = [f"sweep {manifest.name!r}: {len(manifest.jobs)} job(s), {axes}, in {_shown(sweep_dir)}{about}"]
    sizes = []
    for job in manifest.jobs:
        run_dir = sweep_dir / job.run_dir
        action = (
            "completed, skip" if _status(run_dir) == "completed" else "resume" if rundir.is_run_dir(run_dir) else "new"
        )
        s = job_size(configs[job.name])
        sizes.append(s)
        lines.append(f"{_shown(run_dir)} [{action}]: {' '.join(job.overrides)}")
        lines.append(
            f"  {s['steps']:,} steps, {s['tokens']:,} tokens, {s['evals']} evaluations, "
            f"{s['warmup']} warmup steps; {s['params']:,} parameters; disk {size_text(s['disk'])} "
            f"(checkpoint {size_text(s['checkpoint'])}, "
            f"{s['snapshots']} snapshots {size_text(s['snapshot_bytes'])})"
        )
    steps, tokens, disk = (sum(s[key] for s in sizes) for key in ("steps", "tokens", "disk"))
    lines.append(f"total: {len(sizes)} job(s), {steps:,} steps, {tokens:,} tokens, disk {size_text(disk)}")
    return lines
