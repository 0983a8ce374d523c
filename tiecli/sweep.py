# Used by `tiecli sweep`: expand a grid of overrides, run each job as its own `tiecli train` process.
"""A sweep: the Cartesian product of Hydra sweep overrides, run job by job, resumable.

runs/sweeps/<name>/
  sweep.json     the manifest: command, axes, fixed overrides and every job's state, rewritten
                 atomically after each change, so it is true whenever the sweep stops
  logs/<job>.log each job's stdout and stderr, every attempt appended (a job that fails before it
                 creates its run directory still has something to say)
  <job>/         each job's run directory, named by tiecli.config.naming.run_name, written by `tiecli train`
  .lock          held (flock) by the sweep while it runs: one sweep at a time per folder

A job's run_dir and log in sweep.json are relative to the sweep folder, so the folder can move.

Each job is a separate process: a crash or an out-of-memory kill ends that job, not the sweep;
the sweep's death (even kill -9) stops its jobs, which checkpoint first (Linux).
Re-running the same sweep skips completed runs (their summary.json says so), resumes interrupted
ones from their checkpoint and retries failed ones. A re-run may add jobs (more seeds, a new mode)
but not drop any: the manifest always describes every run in the folder.
"""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import signal
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

from tiecli import launchers, rundir
from tiecli.config.checks import to_config
from tiecli.config.compose import check_unique, compose, compose_launcher, config_dirs, group_options, parse_overrides
from tiecli.config.naming import NAME_CHARS, check_name, run_name
from tiecli.config.schema import GROUPS, Config, LauncherConfig
from tiecli.display import PLAIN_EVERY_S, duration, num
from tiecli.errors import ConfigError, TiecliError
from tiecli.model import count_params

MANIFEST = "sweep.json"
SAFE_NAME = re.compile(f"[{NAME_CHARS}]+")
SAFE_VALUE = re.compile(r"[A-Za-z0-9._]+")  # a value shown as is in a default name: '-' separates them there
NAME_LENGTH = 40
JOB_NAME_LENGTH = 56  # "[12/24] NAME: completed at step 500" and the live table's row fit 80 columns
BYTES_PER_PARAM = 4  # fp32 weights, also under bf16 autocast
STUDY_KEYS = ("description", "axes", "fixed", "when", "add", "families")
STATE_STYLES = {"pending": "dim", "running": "yellow", "completed": "green", "failed": "red", "interrupted": "magenta"}
ERROR_TAIL_LINES = 5


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- expanding the overrides into jobs ---------------------------------------------------------


def load_study(name: str, dirs: list[Path]) -> tuple[str, list[str], list[dict], dict]:
    """conf/study/NAME.yaml (the first config dir that has it): its description, its command-line overrides, its
    `when` rules and the rest the manifest keeps: `add` (more values of an axis for some jobs) and `families`."""
    path = next((d / "study" / f"{name}.yaml" for d in dirs if (d / "study" / f"{name}.yaml").is_file()), None)
    if path is None:
        raise ConfigError(f"unknown study {name!r}; valid studies: {', '.join(group_options('study', dirs)) or 'none'}")
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
            f"{str(path)!r}: a study is a mapping with description, axes (key: [values]), fixed (key: value), "
            "when (a list of {match: {axis: value}, set: {key: value}}), add (a list of {match: {axis: value}, "
            "axes: {axis: [values]}}) and families (name: [claim, ...])"
        )
    axes, fixed = study.get("axes") or {}, study.get("fixed") or {}
    lines = [f"{k}={','.join(map(_value, v)) if isinstance(v, list) else _value(v)}" for k, v in axes.items()]
    lines += [f"{k}={_value(v)}" for k, v in fixed.items()]
    for line in lines[len(axes) :]:
        if any(o.is_sweep_override() for o in parse_overrides([line])):
            raise ConfigError(f"study {name!r}: fixed setting {line!r} has several values; move it under axes")
    extra: dict = {"add": _additions(name, study.get("add") or [], axes)}
    if study.get("families") is not None:
        extra["families"] = _families(name, study["families"])
    return str(study.get("description") or ""), lines, _rules(name, study.get("when") or [], axes, fixed), extra


def _families(name: str, spec) -> dict[str, list[str]]:
    """A study's Holm families, checked against the claims the report judges; sweep.json carries them to the report."""
    from tiecli.report.claims import parse_families  # scipy, loaded only for a study that declares families

    try:
        return {k: list(v) for k, v in parse_families(spec, f"study {name!r}").items()}
    except TiecliError as e:
        raise ConfigError(str(e)) from None


def _check_match(where: str, match: dict, axes: dict) -> None:
    """A rule's match names axes of the study, each with one of its values."""
    for key, value in match.items():
        values = axes.get(key)
        if values is None:
            raise ConfigError(f"{where}: matches {key!r}, which is not an axis; the axes are {', '.join(axes)}")
        if isinstance(values, list) and value not in map(_value, values):
            shown = ", ".join(map(_value, values))
            raise ConfigError(f"{where}: {key}={value} is not one of the axis's values: {shown}")


def _additions(name: str, add, axes: dict) -> list[dict]:
    """A study's `add` rules, checked: each repeats the jobs whose axes take `match`'s values for more values of
    some axes (more seeds on the primary comparison); `match` may be empty (every job)."""
    rules = []
    for i, rule in enumerate(add if isinstance(add, list) else [add], 1):
        where = f"study {name!r}, add rule {i}"
        if (
            not isinstance(rule, dict)
            or set(rule) - {"match", "axes"}
            or not isinstance(rule.get("match") or {}, dict)
            or not isinstance(rule.get("axes"), dict)
            or not rule["axes"]
            or not all(isinstance(v, list) and v for v in rule["axes"].values())
        ):
            raise ConfigError(f"{where}: a rule is {{match: {{axis: value, ...}}, axes: {{axis: [values], ...}}}}")
        match = {k: _value(v) for k, v in (rule.get("match") or {}).items()}
        _check_match(where, match, axes)
        for key in rule["axes"]:
            if key not in axes:
                raise ConfigError(
                    f"{where}: adds values to {key!r}, which is not an axis; the axes are {', '.join(axes)}"
                )
        rules.append({"match": match, "axes": {k: list(map(_value, v)) for k, v in rule["axes"].items()}})
    return rules


def _rules(name: str, when, axes: dict, fixed: dict) -> list[dict]:
    """A study's `when` rules, checked: each matches axis values the study has and sets keys it does not sweep or fix.

    A rule gives the jobs whose axes take all of `match`'s values the settings in `set`: how a
    study runs each tying mode at its own learning rate.
    """
    rules = []
    for i, rule in enumerate(when if isinstance(when, list) else [when], 1):
        where = f"study {name!r}, when rule {i}"
        if (
            not isinstance(rule, dict)
            or set(rule) != {"match", "set"}
            or not all(isinstance(rule[k], dict) and rule[k] for k in rule)
        ):
            raise ConfigError(f"{where}: a rule is {{match: {{axis: value, ...}}, set: {{key: value, ...}}}}")
        match = {k: _value(v) for k, v in rule["match"].items()}
        _check_match(where, match, axes)
        settings = [f"{k}={_value(v)}" for k, v in rule["set"].items()]
        for key in rule["set"]:
            if key in axes or key in fixed:
                raise ConfigError(f"{where}: sets {key!r}, which the study already sweeps or fixes")
        if any(o.is_sweep_override() for o in parse_overrides(settings)):
            raise ConfigError(f"{where}: a rule sets one value per key; {settings} has several")
        rules.append({"match": match, "set": settings})
    return rules


def apply_rules(combo: list[str], rules: list[dict]) -> list[str]:
    """One job's override lines followed by the settings of every rule that matches it."""
    values = dict(line.split("=", 1) for line in combo if "=" in line)
    matching = [rule for rule in rules if all(_same(values.get(k), v) for k, v in rule["match"].items())]
    added = [line for rule in matching for line in rule["set"]]
    keys = [line.split("=", 1)[0] for line in added]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice:
        raise ConfigError(f"two when rules set {twice} for the job {' '.join(combo)}; make their matches exclusive")
    return combo + added


def combinations(entries: list[tuple[str, list[str]]], add: list[dict]) -> list[tuple[str, ...]]:
    """The jobs' override lines: the Cartesian product of the entries, in order, then for each `add` rule the
    product's jobs that match it again with its axes' new values (each job once)."""
    jobs = list(itertools.product(*(lines for _, lines in entries)))
    index = {key: i for i, (key, _) in enumerate(entries)}
    for rule in add:
        matching = [j for j in jobs[:] if all(_same(dict(_pairs(j)).get(k), v) for k, v in rule["match"].items())]
        keys = list(rule["axes"])
        for job, values in itertools.product(matching, itertools.product(*rule["axes"].values())):
            new = list(job)
            for key, value in zip(keys, values):
                new[index[key]] = f"{job[index[key]].split('=', 1)[0]}={value}"
            if tuple(new) not in jobs:
                jobs.append(tuple(new))
    return jobs


def _pairs(job) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in job if "=" in line]  # type: ignore[misc]


def _same(given: str | None, wanted: str) -> bool:
    """Whether an axis value matches a rule's: as text, or as numbers (1e-3 on the command line is 0.001)."""
    if given is None:
        return False
    try:
        return given == wanted or float(given) == float(wanted)
    except ValueError:
        return False


def _value(v) -> str:
    """A YAML value as it would be typed on the command line."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def expand(overrides: list[str], dirs: list[Path]) -> tuple[dict | None, list[tuple[str, list[str]]]]:
    """The study (name and description, or None) and, in order, each key with the override lines it takes (one if fixed).

    Command-line overrides replace a study's axis or setting with the same key, in its place.
    """
    parsed = parse_overrides(overrides)
    check_unique(parsed, "on the command line")
    study = next((o for o in parsed if o.key_or_group == "study"), None)
    if study is not None and study.is_sweep_override():
        raise ConfigError(f"{study.input_line!r}: run one study at a time")
    entries: dict = {}
    about: dict | None = None
    if study is not None:
        about = {"name": str(study.value())}
        about["description"], study_lines, rules, extra = load_study(about["name"], dirs)
        study_overrides = parse_overrides(study_lines)
        check_unique(study_overrides, f"in study {about['name']!r}")
        entries = {o.key_or_group: o for o in study_overrides}
        given = {o.key_or_group for o in parsed}  # a setting on the command line wins over a rule's
        rules = [{**r, "set": [line for line in r["set"] if line.split("=", 1)[0] not in given]} for r in rules]
        if rules:
            about["when"] = [r for r in rules if r["set"]]
        # an axis given on the command line replaces the study's, and with it the values `add` gives it
        added = [{**r, "axes": {k: v for k, v in r["axes"].items() if k not in given}} for r in extra["add"]]
        if any(r["axes"] for r in added):
            about["add"] = [r for r in added if r["axes"]]
        if "families" in extra:
            about["families"] = extra["families"]
    entries.update({o.key_or_group: o for o in parsed if o is not study})
    return about, [(key, _lines(o, dirs)) for key, o in entries.items()]


def _lines(o, dirs: list[Path]) -> list[str]:
    """The override lines one override stands for: itself, or one per value of its sweep."""
    if not o.is_sweep_override():
        return [o.input_line]
    if not o.is_discrete_sweep():
        raise ConfigError(f"{o.input_line!r} is not a list of values; use a,b,c, range(start,stop[,step]) or glob(...)")
    # glob() asks a config loader for the group's options; tiecli's own listing covers --config-dir too.
    o.config_loader = SimpleNamespace(get_group_options=lambda group, results_filter=None: group_options(group, dirs))
    values = list(o.sweep_string_iterator())
    if not values:
        where = (
            f"the {o.key_or_group} options: {', '.join(group_options(o.key_or_group, dirs))}"
            if o.key_or_group in GROUPS
            else f"a config group ({', '.join(GROUPS)})"
        )
        raise ConfigError(f"{o.input_line!r} gives no values; glob() matches against {where}")
    return [f"{o.get_key_element()}={v}" for v in values]


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
    stem = re.sub(f"[^{NAME_CHARS}]", "_", "-".join(study_part + shorts))
    return f"{stem[: NAME_LENGTH - 9]}-{digest}" if stem else digest


def plan(
    overrides: list[str], config_dir: Path | None, runs_dir: Path, name: str | None, options: list[str] | None = None
) -> tuple[Path, rundir.SweepManifest, dict[str, Config]]:
    """The sweep folder, its manifest and each job's checked Config (by job name); every job is composed first.

    launcher.* overrides configure the launcher, not the jobs: they and `options` (--launcher, --jobs, ...)
    only join the command recorded to run the sweep again. Writes nothing.
    """
    if name is not None:
        check_name(name, sweep=True)
    dirs = config_dirs(config_dir)
    job_overrides = split_launcher_overrides(overrides)[0]
    study, entries = expand(job_overrides, dirs)
    composed = []
    for combo in combinations(entries, (study or {}).get("add", [])):
        job = apply_rules(list(combo), (study or {}).get("when", []))
        composed.append((job, *compose(job, config_dir)))
    shared = set.intersection(*(set(job) for job, _, _ in composed))
    jobs, configs = [], {}
    for job, cfg, choices in composed:
        job_name = _job_name(choices, cfg, [line for line in job if line not in shared])
        configs[job_name] = to_config(cfg)  # a bad value in any job stops the sweep before anything runs
        jobs.append(rundir.SweepJob(name=job_name, overrides=job, run_dir=job_name, log=f"logs/{job_name}.log"))
    names = [j.name for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ConfigError(f"two jobs would share the run directory {twice!r}; a value is repeated in the sweep")

    values = {key: [line.split("=", 1)[1] for line in lines] for key, lines in entries}
    given = [o.key_or_group for o in parse_overrides(job_overrides) if o.key_or_group != "study"]
    sweep_name = name or default_name(study["name"] if study else None, [(key, values[key]) for key in given])
    sweep_dir = rundir.run_path(Path(runs_dir) / "sweeps", sweep_name)
    command = ["tiecli", "sweep", *overrides, "--name", sweep_name, "--runs-dir", str(runs_dir)]
    command += (["--config-dir", str(config_dir)] if config_dir else []) + list(options or [])
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
        old = rundir.read_manifest(sweep_dir / MANIFEST)
        manifest, configs = _keep_old_names(old, manifest, configs)
        manifest = _merge(old, manifest)
    return sweep_dir, manifest, configs


def _job_name(choices: dict[str, str], cfg, varying: list[str]) -> str:
    """run_name from the overrides that tell this job from the sweep's others (those every job
    shares would add the same hash to every name); those that run_name would hash are written out
    instead (train.lr=1e-3 -> lr1e-3) when that fits JOB_NAME_LENGTH, names apart and needs no quoting."""
    base = run_name(choices, cfg, [])
    hashed = run_name(choices, cfg, varying)
    extras = [line for line in varying if run_name(choices, cfg, [line]) != base]
    if not extras:
        return hashed
    keys = [line.split("=", 1)[0].lstrip("+~").rsplit(".", 1)[-1] for line in extras]
    values = [line.split("=", 1)[1] if "=" in line else "" for line in extras]
    written = "-".join([base, *(k + v for k, v in zip(keys, values))])
    readable = len(set(keys)) == len(keys) and all(re.fullmatch(r"[A-Za-z0-9._-]+", v) for v in values)
    return written if readable and len(written) <= JOB_NAME_LENGTH else hashed


def _keep_old_names(
    old: rundir.SweepManifest, new: rundir.SweepManifest, configs: dict[str, Config]
) -> tuple[rundir.SweepManifest, dict[str, Config]]:
    """A job already in the manifest keeps its name and folder (a sweep named before the shared hash was
    dropped, or one whose shared overrides changed with the jobs added): the same overrides, the same run."""
    by_overrides = {tuple(sorted(j.overrides)): j for j in old.jobs}
    jobs, kept = [], {}
    for job in new.jobs:
        before = by_overrides.get(tuple(sorted(job.overrides)))
        if before is not None and before.name != job.name:
            kept[before.name] = configs[job.name]
            job = dataclasses.replace(job, name=before.name, run_dir=before.run_dir, log=before.log)
        else:
            kept[job.name] = configs[job.name]
        jobs.append(job)
    return dataclasses.replace(new, jobs=jobs), kept


def _merge(old: rundir.SweepManifest, new: rundir.SweepManifest) -> rundir.SweepManifest:
    """The new command's manifest, keeping what the old one knew about the same jobs.

    Adding jobs is allowed (more seeds, a new mode); dropping some is refused, so the manifest
    never stops describing a run that sits in its folder.
    """
    known = {j.name: j for j in old.jobs}
    changed = next(
        (j for j in new.jobs if j.name in known and sorted(known[j.name].overrides) != sorted(j.overrides)), None
    )
    if changed:
        raise TiecliError(
            f"sweep {new.name!r}: job {changed.name!r} ran with `{' '.join(known[changed.name].overrides)}`, "
            f"not `{' '.join(changed.overrides)}`; re-run it with the same overrides (`{old.command}`) or pick another --name"
        )
    dropped = sorted(known.keys() - {j.name for j in new.jobs})
    if dropped:
        raise TiecliError(
            f"sweep {new.name!r} already has {len(dropped)} job(s) this command leaves out (e.g. {dropped[0]!r}); "
            f"re-run it with the same overrides (`{old.command}`) or pick another --name"
        )
    history = ("state", "exit_code", "error", "started", "ended", "attempts", "job_id")
    jobs = [
        dataclasses.replace(job, **{k: getattr(known[job.name], k) for k in history}) if job.name in known else job
        for job in new.jobs
    ]
    return dataclasses.replace(new, created=old.created, jobs=jobs)


# --- running the jobs -------------------------------------------------------------------------------


@dataclasses.dataclass
class Launch:
    """How the jobs run: `--launcher` and its settings (conf/launcher/NAME.yaml), `--jobs`, `--gpus-per-job`."""

    name: str
    settings: LauncherConfig
    parallel: int = 1
    gpus_per_job: int | None = None
    gpus: list[str] = dataclasses.field(default_factory=list)  # this machine's, for basic and submitit_local


def split_launcher_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """The jobs' overrides, and the launcher's (launcher.KEY=VALUE), which configure the sweep, not its runs."""
    jobs: list[str] = []
    launcher: list[str] = []
    for line in overrides:
        (launcher if line.split("=", 1)[0].lstrip("+~").startswith("launcher.") else jobs).append(line)
    return jobs, launcher


def run(
    sweep_dir: Path,
    manifest: rundir.SweepManifest,
    parallel: int,
    console: Console,
    every: float = PLAIN_EVERY_S,
    launch: Launch | None = None,
) -> int:
    """Run every job not yet completed, `parallel` at a time (basic, submitit_local) or as one SLURM job
    array; returns the exit code (0, 1 or 130).

    Without a terminal, each running job gets a progress line at most every `every` seconds.
    """
    launch = launch or Launch("basic", compose_launcher("basic", [], None), parallel)
    launcher = launchers.make(launch.name, sweep_dir, launch.settings, launch.gpus_per_job)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # Two sweeps training the same runs would corrupt them. A lock, not a pid in the manifest: the OS
    # drops it when the sweep dies, so it never outlives the sweep nor mistakes another process for it.
    with rundir.Lock(sweep_dir / rundir.LOCK, f"sweep {manifest.name}"):
        manifest, todo = _prepare(sweep_dir, manifest, console)
        starter = Starter(sweep_dir, manifest, launch, console)
        stopped = _run_jobs(sweep_dir, manifest, todo, launcher, starter, console, every)
    return _conclude(console, manifest, sweep_dir, stopped)


class Starter:
    """Turns a job into the JobSpec of its next attempt: its GPUs (round-robin), threads and torchrun processes."""

    def __init__(self, sweep_dir: Path, manifest: rundir.SweepManifest, launch: Launch, console: Console):
        self.sweep_dir, self.manifest, self.launch = sweep_dir.resolve(), manifest, launch
        self.pool, self.threads, self.nproc = None, None, launch.gpus_per_job or 1
        local = launch.settings.local
        if launch.settings.kind == "submitit_slurm":  # SLURM hands each job its GPUs
            slurm = launchers.slurm_parameters(launch.settings, manifest.name, launch.gpus_per_job)
            self.nproc = max(1, slurm.get("gpus_per_node", 1))
            return
        if launch.gpus:
            note = launchers.check_gpus(launch.gpus, self.nproc, launch.parallel)
            if note:
                console.print(note, highlight=False, markup=False, soft_wrap=True)
            self.pool = launchers.GpuPool(launch.gpus, self.nproc)
        if local is not None and local.threads_per_job is not None:
            self.threads = local.threads_per_job
        elif launch.parallel > 1 and "OMP_NUM_THREADS" not in os.environ:
            # N jobs at once share the CPU: torch's default of one thread per core each would oversubscribe it.
            self.threads = max(1, launchers.cpu_cores() // launch.parallel)  # the allocation, not the node

    def spec(self, job: rundir.SweepJob) -> launchers.JobSpec:
        return launchers.JobSpec(
            name=job.name,
            overrides=job.overrides,
            sweep_dir=str(self.sweep_dir),
            log=job.log,
            config_dir=self.manifest.config_dir,
            attempt=job.attempts + 1,
            nproc=self.nproc,
            gpus=self.pool.take() if self.pool else None,
            threads=self.threads,
        )

    def done(self, running: launchers.Running) -> None:
        if self.pool:
            self.pool.give_back(running.gpus)


def _prepare(
    sweep_dir: Path, manifest: rundir.SweepManifest, console: Console
) -> tuple[rundir.SweepManifest, list[rundir.SweepJob]]:
    """Under the sweep's lock: the manifest as it stands now, each job's state from its run, and the jobs to run."""
    old = rundir.read_manifest(sweep_dir / MANIFEST) if (sweep_dir / MANIFEST).exists() else None
    if old:  # plan() read it before the lock was ours: a sweep that ended meanwhile may have changed it
        manifest = _merge(old, manifest)
    for job in manifest.jobs:
        if job.state == "running" and launchers.still_active(job.job_id, sweep_dir):
            raise TiecliError(
                f"sweep {manifest.name}: job {job.name} ({job.job_id}) from an earlier submission is still queued "
                f"or running; `tiecli sweep --status {manifest.name}` shows it; wait for it, or cancel it first"
            )
        job.state = _current_state(job, sweep_dir)
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


def _current_state(job: rundir.SweepJob, sweep_dir: Path) -> str:
    """A job's state once no process of it runs: the run directory is the truth (a run deleted since, or a
    sweep killed outright, shows up here)."""
    status = _status(sweep_dir / job.run_dir)
    if status == "completed":
        return "completed"
    if job.state in ("running", "completed"):
        return "interrupted" if status else "pending"
    return job.state


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
    launcher,
    starter: Starter,
    console: Console,
    every: float,
) -> bool:
    """Launch and reap the jobs, saving the manifest at every change; returns whether a signal stopped the sweep."""
    jobs = manifest.jobs

    def save() -> None:
        manifest.updated = now()
        rundir.write_manifest(sweep_dir / MANIFEST, manifest)

    running: dict[str, launchers.Running] = {}  # job name -> what its launcher started
    signals = []  # the handler only records; the loop forwards, so a job launched meanwhile is not missed
    stopped = 0
    save()
    previous = {
        s: signal.signal(s, lambda signum, frame: signals.append(signum))
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    watch = Watch(sweep_dir, gpus={})
    plain = None if console.is_terminal else PlainProgress(console, watch, jobs, every)
    live = Live(get_renderable=lambda: jobs_table(jobs, watch), console=console, refresh_per_second=4, transient=True)
    try:
        with live if console.is_terminal else contextlib.nullcontext():
            while (todo and not signals) or running:
                if len(signals) > stopped:
                    stopped = len(signals)
                    _stop(console, launcher, [r.handle for r in running.values()], hard=stopped > 1)
                free = len(todo) if launcher.all_at_once else starter.launch.parallel - len(running)
                if free > 0 and todo and not signals:
                    batch, todo = todo[:free], todo[free:]
                    _submit(batch, launcher, starter, running, sweep_dir)
                    watch.gpus.update({j.name: running[j.name].gpus for j in batch})
                    save()
                    for job in batch:
                        _announce(console, job, jobs, sweep_dir, watch.gpus.get(job.name))
                for job in _reap(jobs, running, launcher, starter, bool(signals), sweep_dir):
                    save()
                    _announce(console, job, jobs, sweep_dir, None)
                if plain:
                    plain.tick([j for j in jobs if j.name in running])
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for started in running.values():  # only after an error in the sweep itself: stop the orphans cleanly
            launcher.stop(started.handle, hard=False)
    save()
    if console.is_terminal:
        console.print(jobs_table(jobs, watch))
    return bool(signals)


def _reap(jobs, running: dict, launcher, starter: Starter, stopping: bool, sweep_dir: Path) -> list[rundir.SweepJob]:
    """The running jobs that have ended, each taken out of `running` and its state recorded."""
    ended_jobs = []
    for job in [j for j in jobs if j.name in running]:
        ended, code = launcher.poll(running[job.name].handle)
        if ended:
            started = running.pop(job.name)
            starter.done(started)
            _finish(job, code, stopping, sweep_dir, started.offset)
            ended_jobs.append(job)
    return ended_jobs


def _submit(
    batch: list[rundir.SweepJob], launcher, starter: Starter, running: dict[str, launchers.Running], sweep_dir: Path
) -> None:
    """Start (or submit) these jobs; each job records its attempt, its launcher's job id and where its log grows from."""
    specs = [starter.spec(job) for job in batch]
    offsets = [_size(sweep_dir / job.log) for job in batch]
    for job, spec, offset, (handle, job_id) in zip(batch, specs, offsets, launcher.submit(specs)):
        running[job.name] = launchers.Running(handle, job_id, spec.gpus, offset)
        job.state, job.attempts, job.started, job.job_id = "running", spec.attempt, now(), job_id
        job.ended = job.exit_code = job.error = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _stop(console: Console, launcher, handles: list, hard: bool) -> None:
    """First Ctrl-C: each job saves a checkpoint and exits 130. Second: kill them (they resume from the last one)."""
    # Jobs run in their own session, so a terminal's Ctrl-C reaches the sweep only and each job gets exactly one.
    for handle in handles:
        launcher.stop(handle, hard)
    console.print(
        "killing the running jobs"
        if hard
        else f"stopping: {len(handles)} running job(s) save a checkpoint and stop (Ctrl-C again kills them)"
    )


def _read(read, default):
    """A run's file while `tiecli train` may be writing it: absent or unreadable for now reads as `default`."""
    try:
        return read()
    except TiecliError:
        return default


def _status(run_dir: Path) -> str | None:
    return _read(rundir.RunReader(run_dir).status, None)


def _finish(job: rundir.SweepJob, code: int | None, stopping: bool, sweep_dir: Path, offset: int) -> None:
    """The job's state from its exit code: 0 completed, 130 (or stopped by us) interrupted, else failed.

    A job that ended without a code (its submitit job was killed, or failed on the cluster) has the state
    its run directory shows: completed, interrupted, or else failed.
    """
    status = _status(sweep_dir / job.run_dir) if code is None else None
    if code == 0 or status == "completed":
        state = "completed"
    elif stopping or code in (130, -signal.SIGINT) or status == "interrupted":
        state = "interrupted"
    else:
        state = "failed"
    job.state, job.exit_code, job.ended = state, code, now()
    job.error = _tail(sweep_dir / job.log, offset, code) if state == "failed" else None


def _tail(log_path: Path, offset: int, code: int | None) -> str:
    """The last lines this attempt wrote: the error, or the end of a traceback; then how the process ended."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        lines = []
    if code is not None and code < 0:
        lines.append(f"killed by {signal.Signals(-code).name}")
    elif code is None:
        lines.append("the job ended without an exit code (killed, or ended by the cluster)")
    return "\n".join(lines[-ERROR_TAIL_LINES:]) or "(no output)"


def _last_error_line(job: rundir.SweepJob) -> str:
    lines = (job.error or "").splitlines()
    return next(
        (line for line in reversed(lines) if line.startswith("error:")),
        lines[-1] if lines else f"exit code {job.exit_code}",
    )


def _announce(
    console: Console, job: rundir.SweepJob, jobs: list[rundir.SweepJob], sweep_dir: Path, gpus: str | None
) -> None:
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
    if counts["interrupted"]:  # stopped by a time limit or preemption, not by us
        console.print(
            f"{counts['interrupted']} job(s) stopped early (a time limit or preemption) and kept a checkpoint; "
            f"run `{manifest.command}` again to resume them",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
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

    def __init__(
        self, sweep_dir: Path, clock: Callable[[], float] = time.time, gpus: dict[str, str | None] | None = None
    ):
        self.sweep_dir, self.clock = sweep_dir, clock
        self.gpus = gpus if gpus is not None else {}  # job name -> CUDA_VISIBLE_DEVICES of its running attempt
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


def show_status(runs_dir: Path, name: str, console: Console) -> None:
    """`tiecli sweep --status NAME`: the jobs table and the counts, from sweep.json, the run directories and the
    launcher's view of jobs still queued or running; submits and writes nothing."""
    check_name(name, sweep=True)
    sweep_dir = rundir.run_path(Path(runs_dir) / "sweeps", name)
    if not (sweep_dir / MANIFEST).exists():
        known = sorted(p.parent.name for p in (Path(runs_dir) / "sweeps").glob(f"*/{MANIFEST}"))
        raise TiecliError(
            f"no sweep {name!r} in {str(Path(runs_dir) / 'sweeps')!r}; sweeps there: {', '.join(known) or 'none'}"
        )
    manifest = rundir.read_manifest(sweep_dir / MANIFEST)
    for job in manifest.jobs:
        live = job.state == "running" and (
            launchers.still_active(job.job_id, sweep_dir) or rundir.RunReader(sweep_dir / job.run_dir).in_use()
        )
        job.state = "running" if live else _current_state(job, sweep_dir)
    console.print(jobs_table(manifest.jobs, Watch(sweep_dir)))
    counts = {s: sum(j.state == s for j in manifest.jobs) for s in STATE_STYLES}
    console.print(
        f"sweep {manifest.name!r} in {_shown(sweep_dir)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _shown(path: Path) -> Path:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def job_size(cfg: Config) -> dict:
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


def launch_options(
    name: str, overrides: list[str], config_dir: Path | None, jobs: int | None, gpus_per_job: int | None
) -> Launch:
    """--launcher NAME with conf/launcher/NAME.yaml and the command line's launcher.* overrides, checked."""
    settings = compose_launcher(name, split_launcher_overrides(overrides)[1], config_dir)
    if settings.kind == "submitit_slurm" and jobs is not None:
        raise ConfigError(
            f"--jobs {jobs} runs jobs at once on this machine; a SLURM job array runs "
            "launcher.slurm.array_parallelism of them at once: set that instead"
        )
    gpus = [] if settings.kind == "submitit_slurm" else launchers.visible_gpus()  # SLURM hands each job its own
    if settings.kind != "submitit_slurm" and (gpus or gpus_per_job):
        launchers.check_gpus(gpus, gpus_per_job or 1, jobs or 1)  # refuses more GPUs a job than there are
    return Launch(name, settings, jobs or 1, gpus_per_job, gpus)


def launch_command(launch: Launch, jobs: int | None) -> list[str]:
    """The sweep command's options that say how it runs, for the manifest's command (run it again to continue)."""
    options = ["--launcher", launch.name] if launch.name != "basic" else []
    options += ["--jobs", str(jobs)] if jobs is not None else []
    return options + (["--gpus-per-job", str(launch.gpus_per_job)] if launch.gpus_per_job else [])


def dry_run_lines(
    sweep_dir: Path,
    manifest: rundir.SweepManifest,
    configs: dict[str, Config],
    launch: Launch | None = None,
    timed: bool = False,
    console: Console | None = None,
) -> list[str]:
    """What `--dry-run` prints: each job's run directory, what running it would do, overrides and size; the total;
    for SLURM the #SBATCH lines of the job array; with `timed`, the wall time from steps timed here."""
    axes = " x ".join(f"{k} ({len(v)})" for k, v in manifest.axes.items()) or "no axes"
    if (manifest.study or {}).get("add"):
        axes += f" + {len(manifest.jobs) - math.prod(len(v) for v in manifest.axes.values())} from add rules"
    about = f" ({manifest.study['description']})" if manifest.study and manifest.study["description"] else ""
    lines = [f"sweep {manifest.name!r}: {len(manifest.jobs)} job(s), {axes}, in {_shown(sweep_dir)}{about}"]
    sizes, left = [], {}
    for job in manifest.jobs:
        run_dir = sweep_dir / job.run_dir
        action = (
            "completed, skip" if _status(run_dir) == "completed" else "resume" if rundir.is_run_dir(run_dir) else "new"
        )
        if action != "completed, skip":
            left[job.name] = progress(run_dir)["step"] if action == "resume" else 0
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
    if launch and launch.settings.kind == "submitit_slurm":
        params = launchers.slurm_parameters(launch.settings, manifest.name, launch.gpus_per_job)
        folder = sweep_dir.resolve() / launchers.SUBMITIT_FOLDER
        lines.append(f"submitit_slurm: the {len(left)} job(s) to run go to SLURM as one array with")
        lines += [f"  {line}" for line in launchers.sbatch_lines(params, max(1, len(left)), folder)]
    if timed:
        lines += estimate_lines({name: configs[name] for name in left}, left, launch, console)
    return lines


def estimate_lines(
    configs: dict[str, Config], done_steps: dict[str, int], launch: Launch | None, console: Console | None
) -> list[str]:
    """The sweep's wall time: a few steps of each model size timed here, then the jobs scheduled on the slots
    the launcher runs at once (GPUs here, the SLURM array's parallelism; on a CPU the jobs share its cores)."""
    from tiecli import estimate

    if not configs:
        return ["estimated wall time: 0s (every job is completed)"]
    paces, lines = {}, []
    for name, c in configs.items():
        key = estimate.size_key(c)
        if key not in paces:
            if console:
                console.print(f"timing {name} ...", highlight=False, markup=False, soft_wrap=True)
            paces[key] = p = estimate.measure(c)
            lines.append(
                f"timed on {p.device} ({p.dtype}, {p.load()}), like {name}: {p.step_s:.3g} s a step "
                f"({p.steps} step(s) of {c.tokens_per_step:,} tokens), {p.eval_batch_s:.3g} s an evaluation batch"
            )
    seconds = [estimate.job_seconds(c, paces[estimate.size_key(c)], done_steps[n]) for n, c in configs.items()]
    launch = launch or Launch("basic", LauncherConfig("basic"), 1)
    if launch.settings.kind == "submitit_slurm":
        assert launch.settings.slurm is not None
        slots, how = (
            launch.settings.slurm.array_parallelism,
            "launcher.slurm.array_parallelism; timed on this machine, not the cluster's nodes",
        )
    else:
        gpus = launch.gpus
        slots = max(1, min(launch.parallel, len(gpus) // (launch.gpus_per_job or 1))) if gpus else 1
        how = f"{slots} at a time on this machine's GPUs" if gpus else "one at a time: jobs at once share the CPU cores"
    wall = estimate.wall_time(seconds, slots)
    lines.append(
        f"estimated wall time: {duration(wall)} for {len(seconds)} job(s), {duration(sum(seconds))} of job time "
        f"({how}); training steps and in-training evaluations only: data preparation, gradient diagnostics "
        "and the final evaluations add to it"
    )
    return lines
