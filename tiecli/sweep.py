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

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from tiecli import config, rundir
from tiecli.display import num
from tiecli.errors import ConfigError, TiecliError

MANIFEST = "sweep.json"
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
        raise ConfigError(f"unknown study {name!r}; valid studies: {', '.join(config.group_options('study', dirs)) or 'none'}")
    try:
        study = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(study, dict) or set(study) - set(STUDY_KEYS) or not all(isinstance(study.get(k) or {}, dict) for k in ("axes", "fixed")):
        raise ConfigError(f"{str(path)!r}: a study is a mapping with description, axes (key: [values]) and fixed (key: value)")
    axes = [f"{k}={','.join(map(_value, v)) if isinstance(v, list) else _value(v)}" for k, v in (study.get("axes") or {}).items()]
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
        about["description"], study_overrides = load_study(about["name"], dirs)
        study_overrides = config.parse_overrides(study_overrides)
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
    o.config_loader = SimpleNamespace(get_group_options=lambda group, results_filter=None: config.group_options(group, dirs))
    values = list(o.sweep_string_iterator())
    if not values:
        where = f"the {o.key_or_group} options: {', '.join(config.group_options(o.key_or_group, dirs))}" if o.key_or_group in config.GROUPS \
            else f"a config group ({', '.join(config.GROUPS)})"
        raise ConfigError(f"{o.input_line!r} gives no values; glob() matches against {where}")
    return [f"{o.get_key_element()}={v}" for v in values]


def default_name(study: str | None, overrides: list[str]) -> str:
    """The study name and the other command-line overrides, filesystem-safe and at most 80 characters."""
    parts = ([study] if study else []) + [o for o in overrides if not o.startswith("study=")]
    name = re.sub(r"[^A-Za-z0-9._,=+-]", "_", "+".join(parts) or "sweep")
    if len(name) > 80:
        name = name[:69] + "-" + hashlib.sha256(name.encode()).hexdigest()[:10]
    return name


def plan(overrides: list[str], config_dir: Path | None, runs_dir: Path, name: str | None) -> tuple[Path, rundir.SweepManifest]:
    """The sweep folder and its manifest, every job composed and checked first; writes nothing."""
    dirs = config.config_dirs(config_dir)
    study, entries = expand(overrides, dirs)
    jobs = []
    for combo in itertools.product(*(lines for _, lines in entries)):
        cfg, choices = config.compose(list(combo), config_dir)
        config.to_config(cfg)  # a bad value in any job stops the sweep before anything runs
        job_name = config.run_name(choices, cfg, list(combo))
        jobs.append(rundir.SweepJob(name=job_name, overrides=list(combo), run_dir=job_name, log=f"logs/{job_name}.log"))
    names = [j.name for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ConfigError(f"two jobs would share the run directory {twice!r}; a value is repeated in the sweep")

    sweep_name = name or default_name(study and study["name"], overrides)
    sweep_dir = rundir.run_path(Path(runs_dir) / "sweeps", sweep_name)
    command = ["tiecli", "sweep", *overrides, "--name", sweep_name, "--runs-dir", str(runs_dir)]
    command += ["--config-dir", str(config_dir)] if config_dir else []
    manifest = rundir.SweepManifest(
        name=sweep_name, created=now(), updated=now(), command=shlex.join(command),
        config_dir=str(dirs[0]) if config_dir else None, study=study,
        axes={key: [line.split("=", 1)[1] for line in lines] for key, lines in entries if len(lines) > 1},
        fixed=[lines[0] for _, lines in entries if len(lines) == 1], jobs=jobs)
    if (sweep_dir / MANIFEST).exists():
        manifest = _merge(rundir.read_manifest(sweep_dir / MANIFEST), manifest)
    return sweep_dir, manifest


def _merge(old: rundir.SweepManifest, new: rundir.SweepManifest) -> rundir.SweepManifest:
    """The new command's manifest, keeping what the old one knew about the same jobs.

    Adding jobs is allowed (more seeds, a new mode); dropping some is refused, so the manifest
    never stops describing a run that sits in its folder.
    """
    known = {j.name: j for j in old.jobs}
    dropped = sorted(known.keys() - {j.name for j in new.jobs})
    if dropped:
        raise TiecliError(f"sweep {new.name!r} already has {len(dropped)} job(s) this command leaves out (e.g. {dropped[0]!r}); "
                          f"re-run it with the same overrides (`{old.command}`) or pick another --name")
    history = ("state", "exit_code", "error", "started", "ended", "attempts")
    jobs = [dataclasses.replace(job, **{k: getattr(known[job.name], k) for k in history}) if job.name in known else job
            for job in new.jobs]
    return dataclasses.replace(new, created=old.created, jobs=jobs)


# --- running the jobs -------------------------------------------------------------------------------


def run(sweep_dir: Path, manifest: rundir.SweepManifest, parallel: int, console: Console) -> int:
    """Run every job not yet completed, `parallel` at a time; returns the exit code (0, 1 or 130)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # Two sweeps training the same runs would corrupt them. A lock, not a pid in the manifest: the OS
    # drops it when the sweep dies, so it never outlives the sweep nor mistakes another process for it.
    with rundir.Lock(sweep_dir / rundir.LOCK, f"sweep {manifest.name}"):
        manifest, todo = _prepare(sweep_dir, manifest, console)
        stopped = _run_jobs(sweep_dir, manifest, todo, parallel, console)
    return _conclude(console, manifest, sweep_dir, stopped)


def _prepare(sweep_dir: Path, manifest: rundir.SweepManifest, console: Console) -> tuple[rundir.SweepManifest, list[rundir.SweepJob]]:
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
        console.print(f"sweep {manifest.name!r}: {len(manifest.jobs) - len(old.jobs)} new job(s) added to the {len(old.jobs)} in its manifest")
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


def _run_jobs(sweep_dir: Path, manifest: rundir.SweepManifest, todo: list[rundir.SweepJob], parallel: int, console: Console) -> bool:
    """Launch and reap the jobs, saving the manifest at every change; returns whether a signal stopped the sweep."""
    jobs = manifest.jobs

    def save() -> None:
        manifest.updated = now()
        rundir.write_manifest(sweep_dir / MANIFEST, manifest)

    running = {}  # job name -> (process, where this attempt starts in the job's log)
    signals = []  # the handler only records; the loop forwards, so a job launched meanwhile is not missed
    stopped = 0
    save()
    previous = {s: signal.signal(s, lambda signum, frame: signals.append(signum)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    cache = {}
    live = Live(get_renderable=lambda: jobs_table(jobs, sweep_dir, cache), console=console, refresh_per_second=4, transient=True)
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
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for proc, _ in running.values():  # only after an error in the sweep itself: stop the orphans cleanly
            proc.send_signal(signal.SIGINT)
    save()
    if console.is_terminal:
        console.print(jobs_table(jobs, sweep_dir, cache))
    return bool(signals)


def _stop(console: Console, procs: list[subprocess.Popen], hard: bool) -> None:
    """First Ctrl-C: each job saves a checkpoint and exits 130. Second: kill them (they resume from the last one)."""
    # Jobs run in their own session, so a terminal's Ctrl-C reaches the sweep only and each job gets exactly one.
    for proc in procs:
        if hard:
            proc.kill()
        else:
            proc.send_signal(signal.SIGINT)
    console.print("killing the running jobs" if hard else
                  f"stopping: {len(procs)} running job(s) save a checkpoint and stop (Ctrl-C again kills them)")


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


def _launch(job: rundir.SweepJob, sweep_dir: Path, config_dir: str | None, parallel: int) -> tuple[subprocess.Popen, int]:
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
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=_stop_with_sweep())
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
    return next((line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else f"exit code {job.exit_code}")


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
    console.print(f"sweep {manifest.name!r} in {_shown(sweep_dir)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
                  highlight=False, markup=False, soft_wrap=True)
    for job in jobs:
        if job.state == "failed":
            console.print(f"failed: {job.name}: {_last_error_line(job)} (log: {_shown(sweep_dir / job.log)})", highlight=False, markup=False, soft_wrap=True)
    if counts["completed"] == len(jobs):
        return 0
    if stopped:
        console.print(f"interrupted; run `{manifest.command}` again to continue", highlight=False, markup=False, soft_wrap=True)
        return 130
    return 1


# --- what the jobs are doing -----------------------------------------------------------------------


def progress(run_dir: Path) -> dict:
    """Step, losses and ETA of a run, from the files `tiecli train` keeps writing."""
    reader = rundir.RunReader(run_dir)
    summary = _read(reader.summary, None)
    rows = _read(reader.metrics, [])
    step = rows[-1].step if rows else summary.step if summary else 0
    loss = next((r.loss for r in reversed(rows) if r.loss is not None), None)
    final = (summary.final_val or {}).get("loss") if summary else None
    val_loss = final or next((r.val_loss for r in reversed(rows) if r.val_loss is not None), None)
    eta = None
    if summary and summary.status == "running" and step > summary.step:
        # summary.json is written at the start of each attempt: its step and time give the pace.
        elapsed = (datetime.now(timezone.utc) - datetime.fromisoformat(summary.started)).total_seconds()
        eta = elapsed / (step - summary.step) * (summary.max_steps - step)
    return {"step": step, "max_steps": summary.max_steps if summary else None, "loss": loss, "val_loss": val_loss, "eta": eta}


def jobs_table(jobs: list[rundir.SweepJob], sweep_dir: Path, cache: dict) -> Table:
    """The live table; a job's files are read again only while it runs (cache: (name, state) -> progress)."""
    table = Table(title=f"sweep {sweep_dir.name}")
    for column, justify in (("job", "left"), ("state", "left"), ("step", "right"), ("loss", "right"), ("val loss", "right"), ("ETA", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == "job" else "ellipsis")
    for job in jobs:
        key = (job.name, job.state)
        if job.state == "running" or key not in cache:
            cache[key] = progress(sweep_dir / job.run_dir)
        p = cache[key]
        steps = f"{p['step']}/{p['max_steps']}" if p["max_steps"] else "-"
        eta = f"{int(p['eta']) // 60}m{int(p['eta']) % 60:02d}s" if p["eta"] is not None else "-"
        state = f"[{STATE_STYLES[job.state]}]{job.state}[/]"
        table.add_row(job.name, state, steps, num(p["loss"], ".4f"), num(p["val_loss"], ".4f"), eta)
    return table


def _shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def dry_run_lines(sweep_dir: Path, manifest: rundir.SweepManifest) -> list[str]:
    """What `--dry-run` prints: each job's run directory, what running it would do, and its overrides."""
    axes = " x ".join(f"{k} ({len(v)})" for k, v in manifest.axes.items()) or "no axes"
    about = f" ({manifest.study['description']})" if manifest.study and manifest.study["description"] else ""
    lines = [f"sweep {manifest.name!r}: {len(manifest.jobs)} job(s), {axes}, in {_shown(sweep_dir)}{about}"]
    for job in manifest.jobs:
        run_dir = sweep_dir / job.run_dir
        action = "completed, skip" if _status(run_dir) == "completed" else "resume" if rundir.is_run_dir(run_dir) else "new"
        lines.append(f"{_shown(run_dir)} [{action}]: {' '.join(job.overrides)}")
    return lines
