# Used by `tiecli sweep`: expand a grid of overrides, run each job as its own `tiecli train` process.
"""A sweep: the Cartesian product of Hydra sweep overrides, run job by job, resumable.

runs/sweeps/<name>/
  sweep.json     the manifest: command, axes, fixed overrides and every job's state, rewritten
                 atomically after each change, so it is true whenever the sweep stops
  logs/<job>.log each job's stdout and stderr, every attempt appended (a job that fails before it
                 creates its run directory still has something to say)
  <job>/         each job's run directory, named by config.run_name, written by `tiecli train`

A job's run_dir and log in sweep.json are relative to the sweep folder, so the folder can move.

Each job is a separate process: a crash or an out-of-memory kill ends that job, not the sweep.
Re-running the same sweep skips completed runs (their summary.json says so), resumes interrupted
ones from their checkpoint and retries failed ones. A re-run may add jobs (more seeds, a new mode)
but not drop any: the manifest always describes every run in the folder.
"""

import contextlib
import hashlib
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
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
    _check_unique(parsed, "on the command line")
    study = next((o for o in parsed if o.key_or_group == "study"), None)
    if study is not None and study.is_sweep_override():
        raise ConfigError(f"{study.input_line!r}: run one study at a time")
    entries, about = {}, None
    if study is not None:
        about = {"name": str(study.value())}
        about["description"], study_overrides = load_study(about["name"], dirs)
        study_overrides = config.parse_overrides(study_overrides)
        _check_unique(study_overrides, f"in study {about['name']!r}")
        entries = {o.key_or_group: o for o in study_overrides}
    entries.update({o.key_or_group: o for o in parsed if o is not study})
    return about, [(key, _lines(o, dirs)) for key, o in entries.items()]


def _check_unique(parsed, where: str) -> None:
    seen = set()
    for o in parsed:
        if o.key_or_group in seen:
            raise ConfigError(f"{o.key_or_group!r} is given twice {where}; give it once (a,b,c sweeps several values)")
        seen.add(o.key_or_group)


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


def plan(overrides: list[str], config_dir: Path | None, runs_dir: Path, name: str | None) -> tuple[Path, dict]:
    """The sweep folder and its manifest, every job composed and checked first; writes nothing."""
    dirs = config.config_dirs(config_dir)
    study, entries = expand(overrides, dirs)
    jobs = []
    for combo in itertools.product(*(lines for _, lines in entries)):
        cfg, choices = config.compose(list(combo), config_dir)
        config.to_config(cfg)  # a bad value in any job stops the sweep before anything runs
        job_name = config.run_name(choices, cfg, list(combo))
        jobs.append({"name": job_name, "overrides": list(combo), "run_dir": job_name, "log": f"logs/{job_name}.log",
                     "state": "pending", "exit_code": None, "error": None, "started": None, "ended": None, "attempts": 0})
    names = [j["name"] for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ConfigError(f"two jobs would share the run directory {twice!r}; a value is repeated in the sweep")

    sweep_name = name or default_name(study and study["name"], overrides)
    sweep_dir = rundir.run_path(Path(runs_dir) / "sweeps", sweep_name)
    command = ["tiecli", "sweep", *overrides, "--name", sweep_name, "--runs-dir", str(runs_dir)]
    command += ["--config-dir", str(config_dir)] if config_dir else []
    manifest = {"name": sweep_name, "created": now(), "updated": now(), "command": shlex.join(command),
                "config_dir": str(dirs[0]) if config_dir else None, "study": study,
                "axes": {key: [line.split("=", 1)[1] for line in lines] for key, lines in entries if len(lines) > 1},
                "fixed": [lines[0] for _, lines in entries if len(lines) == 1], "jobs": jobs}
    if (sweep_dir / MANIFEST).exists():
        manifest = _merge(rundir.read_json(sweep_dir / MANIFEST), manifest)
    return sweep_dir, manifest


def _merge(old: dict, new: dict) -> dict:
    """The new command's manifest, keeping what the old one knew about the same jobs.

    Adding jobs is allowed (more seeds, a new mode); dropping some is refused, so the manifest
    never stops describing a run that sits in its folder.
    """
    known = {j["name"]: j for j in old.get("jobs", [])}
    dropped = sorted(known.keys() - {j["name"] for j in new["jobs"]})
    if dropped:
        raise TiecliError(f"sweep {new['name']!r} already has {len(dropped)} job(s) this command leaves out (e.g. {dropped[0]!r}); "
                          f"re-run it with the same overrides (`{old.get('command')}`) or pick another --name")
    history = ("state", "exit_code", "error", "started", "ended", "attempts")
    jobs = [{**job, **{k: known[job["name"]][k] for k in history if k in known.get(job["name"], {})}} for job in new["jobs"]]
    return {**new, "created": old.get("created", new["created"]), "jobs": jobs}


# --- running the jobs -------------------------------------------------------------------------------


def run(sweep_dir: Path, manifest: dict, parallel: int, console: Console) -> int:
    """Run every job not yet completed, `parallel` at a time; returns the exit code (0, 1 or 130)."""
    jobs = manifest["jobs"]
    old = rundir.read_json(sweep_dir / MANIFEST) if (sweep_dir / MANIFEST).exists() else {}
    if old.get("pid") and _alive(old["pid"]):  # two sweeps training the same runs would corrupt them
        raise TiecliError(f"sweep {manifest['name']!r} is already running (process {old['pid']}); let it finish or stop it first")
    if old and len(jobs) > len(old.get("jobs", [])):
        console.print(f"sweep {manifest['name']!r}: {len(jobs) - len(old['jobs'])} new job(s) added to the {len(old['jobs'])} in its manifest")
    for job in jobs:
        # The run directory is the truth: a run deleted since, or a sweep killed outright, shows up here.
        status = _status(sweep_dir / job["run_dir"])
        if status == "completed":
            job["state"] = "completed"
        elif job["state"] in ("running", "completed"):
            job["state"] = "interrupted" if status else "pending"
    todo = [j for j in jobs if j["state"] != "completed"]
    if len(todo) < len(jobs):
        console.print(f"{len(jobs) - len(todo)} of {len(jobs)} jobs already completed; skipping them")

    def save(pid: int | None = os.getpid()) -> None:  # pid: this process while it runs, None once it is done
        manifest.update(updated=now(), pid=pid)
        rundir.write_json(sweep_dir / MANIFEST, manifest)

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
                    running[job["name"]] = _launch(job, sweep_dir, manifest["config_dir"], parallel)
                    save()
                    _announce(console, job, jobs, sweep_dir)
                for job in [j for j in jobs if j["name"] in running]:
                    proc, offset = running[job["name"]]
                    if proc.poll() is None:
                        continue
                    del running[job["name"]]
                    _finish(job, proc.returncode, bool(signals), sweep_dir / job["log"], offset)
                    save()
                    _announce(console, job, jobs, sweep_dir)
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for proc, _ in running.values():  # only after an error in the sweep itself: stop the orphans cleanly
            proc.send_signal(signal.SIGINT)
    save(pid=None)
    if console.is_terminal:
        console.print(jobs_table(jobs, sweep_dir, cache))
    return _conclude(console, manifest, sweep_dir, bool(signals))


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()


def _status(run_dir: Path) -> str | None:
    path = run_dir / rundir.SUMMARY
    try:
        return rundir.read_json(path).get("status") if path.exists() else None
    except TiecliError:
        return None


def _launch(job: dict, sweep_dir: Path, config_dir: str | None, parallel: int) -> tuple[subprocess.Popen, int]:
    run_dir = sweep_dir / job["run_dir"]
    command = [sys.executable, "-m", "tiecli", "train", "--runs-dir", str(sweep_dir), "--name", job["name"]]
    command += ["--resume"] if rundir.is_run_dir(run_dir) else []
    command += ["--config-dir", config_dir] if config_dir else []
    command += ["--", *job["overrides"]]  # "--": an override can never be read as an option
    log_path = sweep_dir / job["log"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"\n# attempt {job['attempts'] + 1}, {now()}: {shlex.join(command[1:])}\n")
        log.flush()
        offset = log.tell()
        # N jobs at once share the CPU: torch's default of one thread per core each would oversubscribe it.
        env = {"COLUMNS": "200", **os.environ}  # job logs are files: rich would wrap them at 80 columns
        if parallel > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // parallel))
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    job.update(state="running", attempts=job["attempts"] + 1, started=now(), ended=None, exit_code=None, error=None)
    return proc, offset


def _finish(job: dict, code: int, stopping: bool, log_path: Path, offset: int) -> None:
    """The job's state from its exit code: 0 completed, 130 (or stopped by us) interrupted, else failed."""
    if code == 0:
        state = "completed"
    elif stopping or code in (130, -signal.SIGINT):
        state = "interrupted"
    else:
        state = "failed"
    job.update(state=state, exit_code=code, ended=now(), error=_tail(log_path, offset) if state == "failed" else None)


def _tail(log_path: Path, offset: int) -> str:
    """The last lines this attempt wrote: the error, or the end of a traceback."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return "\n".join(lines[-ERROR_TAIL_LINES:]) or "(no output)"


def _last_error_line(job: dict) -> str:
    lines = (job.get("error") or "").splitlines()
    return next((line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else f"exit code {job['exit_code']}")


def _announce(console: Console, job: dict, jobs: list[dict], sweep_dir: Path) -> None:
    """Without a terminal (a log file, CI) there is no live table: one line per state change instead."""
    if console.is_terminal:
        return
    number = f"[{jobs.index(job) + 1}/{len(jobs)}]"
    detail = ""
    if job["state"] == "running":
        detail = f" (attempt {job['attempts']})"
    elif job["state"] == "completed":
        p = progress(sweep_dir / job["run_dir"])
        detail = f" at step {p['step']}, val loss {num(p['val_loss'], '.4f')}"
    elif job["state"] == "failed":
        detail = f" (exit {job['exit_code']}): {_last_error_line(job)}"
    elif job["state"] == "interrupted":
        detail = f" at step {progress(sweep_dir / job['run_dir'])['step']}"
    console.print(f"{number} {job['name']}: {job['state']}{detail}", highlight=False, markup=False, soft_wrap=True)


def _conclude(console: Console, manifest: dict, sweep_dir: Path, stopped: bool) -> int:
    jobs = manifest["jobs"]
    counts = {s: sum(j["state"] == s for j in jobs) for s in STATE_STYLES}
    console.print(f"sweep {manifest['name']!r} in {_shown(sweep_dir)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
                  highlight=False, markup=False, soft_wrap=True)
    for job in jobs:
        if job["state"] == "failed":
            console.print(f"failed: {job['name']}: {_last_error_line(job)} (log: {_shown(sweep_dir / job['log'])})", highlight=False, markup=False, soft_wrap=True)
    if counts["completed"] == len(jobs):
        return 0
    if stopped:
        console.print(f"interrupted; run `{manifest['command']}` again to continue", highlight=False, markup=False, soft_wrap=True)
        return 130
    return 1


# --- what the jobs are doing -----------------------------------------------------------------------


def progress(run_dir: Path) -> dict:
    """Step, losses and ETA of a run, from the files `tiecli train` keeps writing."""
    path = run_dir / rundir.SUMMARY
    try:
        summary = rundir.read_json(path) if path.exists() else {}
    except TiecliError:
        summary = {}
    rows = rundir.read_jsonl(run_dir / rundir.METRICS)
    step = rows[-1]["step"] if rows else summary.get("step", 0)
    loss = next((r["loss"] for r in reversed(rows) if "loss" in r), None)
    val_loss = (summary.get("final_val") or {}).get("loss") or next((r["val_loss"] for r in reversed(rows) if "val_loss" in r), None)
    eta = None
    start_step = summary.get("step", 0)
    if summary.get("status") == "running" and step > start_step:
        # summary.json is written at the start of each attempt: its step and time give the pace.
        elapsed = (datetime.now(timezone.utc) - datetime.fromisoformat(summary["started"])).total_seconds()
        eta = elapsed / (step - start_step) * (summary["max_steps"] - step)
    return {"step": step, "max_steps": summary.get("max_steps"), "loss": loss, "val_loss": val_loss, "eta": eta}


def jobs_table(jobs: list[dict], sweep_dir: Path, cache: dict) -> Table:
    """The live table; a job's files are read again only while it runs (cache: (name, state) -> progress)."""
    table = Table(title=f"sweep {sweep_dir.name}")
    for column, justify in (("job", "left"), ("state", "left"), ("step", "right"), ("loss", "right"), ("val loss", "right"), ("ETA", "right")):
        table.add_column(column, justify=justify, overflow="fold" if column == "job" else "ellipsis")
    for job in jobs:
        key = (job["name"], job["state"])
        if job["state"] == "running" or key not in cache:
            cache[key] = progress(sweep_dir / job["run_dir"])
        p = cache[key]
        steps = f"{p['step']}/{p['max_steps']}" if p["max_steps"] else "-"
        eta = f"{int(p['eta']) // 60}m{int(p['eta']) % 60:02d}s" if p["eta"] is not None else "-"
        state = f"[{STATE_STYLES[job['state']]}]{job['state']}[/]"
        table.add_row(job["name"], state, steps, num(p["loss"], ".4f"), num(p["val_loss"], ".4f"), eta)
    return table


def _shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def dry_run_lines(sweep_dir: Path, manifest: dict) -> list[str]:
    """What `--dry-run` prints: each job's run directory, what running it would do, and its overrides."""
    axes = " x ".join(f"{k} ({len(v)})" for k, v in manifest["axes"].items()) or "no axes"
    about = f" ({manifest['study']['description']})" if manifest["study"] and manifest["study"]["description"] else ""
    lines = [f"sweep {manifest['name']!r}: {len(manifest['jobs'])} job(s), {axes}, in {_shown(sweep_dir)}{about}"]
    for job in manifest["jobs"]:
        run_dir = sweep_dir / job["run_dir"]
        action = "completed, skip" if _status(run_dir) == "completed" else "resume" if rundir.is_run_dir(run_dir) else "new"
        lines.append(f"{_shown(run_dir)} [{action}]: {' '.join(job['overrides'])}")
    return lines
