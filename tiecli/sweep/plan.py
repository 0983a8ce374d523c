# Used by `tiecli sweep`: the command line's overrides (and a study's) expanded into named jobs.
"""The plan of a sweep: its jobs, their names and overrides, its folder and its manifest, before anything runs.

The jobs are the Cartesian product of the swept overrides (a,b,c, range(0,3), glob(*), or a study's
axes), then the jobs a study's `add` rules repeat; a study's `when` rules add settings to the jobs they
match. Each job is named by run_name from the overrides that tell it from the others, and runs
in runs/sweeps/<sweep>/<job>/.
"""

import dataclasses
import hashlib
import itertools
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import tiecli.sweep.manifest as manifests
from tiecli.config.checks import to_config
from tiecli.config.compose import check_unique, compose, config_dirs, group_options, parse_overrides
from tiecli.config.naming import NAME_CHARS, check_name, run_name
from tiecli.config.schema import GROUPS, Config
from tiecli.errors import ConfigError
from tiecli.run.files import now
from tiecli.run.layout import run_path
from tiecli.run.records import SweepJob, SweepManifest
from tiecli.sweep.study import apply_rules, load_study, matches

SAFE_NAME = re.compile(f"[{NAME_CHARS}]+")
SAFE_VALUE = re.compile(r"[A-Za-z0-9._]+")  # a value shown as is in a default name: '-' separates them there
NAME_LENGTH = 40
JOB_NAME_LENGTH = 56  # "[12/24] NAME: completed at step 500" and the live table's row fit 80 columns


def plan(
    overrides: list[str],
    config_dir: Path | None,
    runs_dir: Path,
    name: str | None,
    options: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, SweepManifest, dict[str, Config]]:
    """The sweep folder, its manifest and each job's checked Config (by job name); every job is composed first.

    launcher.* overrides configure the launcher, not the jobs: they and `options` (--launcher, --jobs, ...)
    only join the command recorded to run the sweep again. `progress(done, total)` is told of each job composed
    (thousands of jobs take minutes). Writes nothing.
    """
    if name is not None:
        check_name(name, sweep=True)
    dirs = config_dirs(config_dir)
    job_overrides = split_launcher_overrides(overrides)[0]
    study, entries = expand(job_overrides, dirs)
    composed = []
    combos = combinations(entries, (study or {}).get("add", []))
    for combo in combos:
        job = apply_rules(list(combo), (study or {}).get("when", []))
        composed.append((job, *compose(job, config_dir)))
        if progress:
            progress(len(composed), len(combos))
    shared = set.intersection(*(set(job) for job, _, _ in composed))
    jobs, configs = [], {}
    for job, cfg, choices in composed:
        job_name = _job_name(choices, cfg, [line for line in job if line not in shared])
        configs[job_name] = to_config(cfg)  # a bad value in any job stops the sweep before anything runs
        jobs.append(SweepJob(name=job_name, overrides=job, run_dir=job_name, log=f"logs/{job_name}.log"))
    names = [j.name for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ConfigError(f"two jobs would share the run directory {twice!r}; a value is repeated in the sweep")

    values = {key: [line.split("=", 1)[1] for line in lines] for key, lines in entries}
    given = [o.key_or_group for o in parse_overrides(job_overrides) if o.key_or_group != "study"]
    sweep_name = name or default_name(study["name"] if study else None, [(key, values[key]) for key in given])
    sweep_dir = run_path(Path(runs_dir) / "sweeps", sweep_name)
    command = ["tiecli", "sweep", *overrides, "--name", sweep_name, "--runs-dir", str(runs_dir)]
    command += (["--config-dir", str(config_dir)] if config_dir else []) + list(options or [])
    manifest = SweepManifest(
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
    old = manifests.read(sweep_dir)
    if old:
        old = same_runs(old, manifest, configs, config_dir)
        manifest, configs = manifests.keep_old_names(old, manifest, configs)
        manifest = manifests.merge(old, manifest)
    return sweep_dir, manifest, configs


def same_runs(
    old: SweepManifest, new: SweepManifest, configs: dict[str, Config], config_dir: Path | None
) -> SweepManifest:
    """The old manifest, where a job whose overrides no new job has, but whose config a new job's equals, takes that
    job's overrides: a new axis (train.lr=1e-3,3e-3) one of whose values the old jobs ran, by default or as
    given, extends the sweep with the other values' jobs only, as more values on an old axis do."""
    given = {tuple(sorted(j.overrides)) for j in new.jobs}
    free = [j for j in new.jobs if tuple(sorted(j.overrides)) not in {tuple(sorted(o.overrides)) for o in old.jobs}]
    jobs = []
    for job in old.jobs:
        if tuple(sorted(job.overrides)) not in given and free:
            try:
                ran = to_config(compose(job.overrides, config_dir)[0])
            except ConfigError:  # overrides conf/ no longer takes: the job is left out, as before
                ran = None
            same = next((j for j in free if configs[j.name] == ran), None)
            if same is not None:
                free.remove(same)
                job = dataclasses.replace(job, overrides=same.overrides)
        jobs.append(job)
    return dataclasses.replace(old, jobs=jobs)


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


def split_launcher_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """The jobs' overrides, and the launcher's (launcher.KEY=VALUE), which configure the sweep, not its runs."""
    jobs: list[str] = []
    launcher: list[str] = []
    for line in overrides:
        (launcher if line.split("=", 1)[0].lstrip("+~").startswith("launcher.") else jobs).append(line)
    return jobs, launcher


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


def combinations(entries: list[tuple[str, list[str]]], add: list[dict]) -> list[tuple[str, ...]]:
    """The jobs' override lines: the Cartesian product of the entries, in order, then for each `add` rule the
    product's jobs that match it again with its axes' new values (each job once)."""
    jobs = list(itertools.product(*(lines for _, lines in entries)))
    index = {key: i for i, (key, _) in enumerate(entries)}
    for rule in add:
        matching = [j for j in jobs[:] if matches(j, rule["match"])]
        keys = list(rule["axes"])
        for job, values in itertools.product(matching, itertools.product(*rule["axes"].values())):
            new = list(job)
            for key, value in zip(keys, values):
                new[index[key]] = f"{job[index[key]].split('=', 1)[0]}={value}"
            if tuple(new) not in jobs:
                jobs.append(tuple(new))
    return jobs
