# Used by `tiecli sweep`: sweep.json, the manifest that says what a sweep folder holds.
"""The manifest, runs/sweeps/<name>/sweep.json: the command, the axes, the fixed overrides and every job's state.

It is rewritten atomically after each change, so it is true whenever the sweep stops. A job's
run_dir and log in it are relative to the sweep folder, so the folder can move. A re-run may add
jobs (more seeds, a new mode) and drop jobs that never started, but not one that did: the manifest
always describes every run and log in the folder.
Its records (SweepManifest, SweepJob) are read and written by the storage layer.
"""

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from tiecli.errors import TiecliError
from tiecli.run.files import now
from tiecli.run.layout import MANIFEST
from tiecli.run.records import ADDED, SweepManifest, read_manifest, write_manifest

if TYPE_CHECKING:  # a submitit job imports this module (through launchers): it needs no Hydra
    from tiecli.config.schema import Config


def read(sweep_dir: Path) -> SweepManifest | None:
    """The sweep folder's manifest; None before the sweep first ran."""
    return read_manifest(sweep_dir / MANIFEST) if (sweep_dir / MANIFEST).exists() else None


def save(sweep_dir: Path, manifest: SweepManifest) -> None:
    """Write the manifest (atomically), stamped with the time of this change."""
    manifest.updated = now()
    write_manifest(sweep_dir / MANIFEST, manifest)


def same_run(overrides: list[str]) -> tuple[str, ...]:
    """The overrides as a run reads them, sorted: less those that state a key added since at the value runs
    made before it read (records.ADDED), so a study that pins `eval.max_seconds=null` for the jobs it adds
    still finds the jobs it ran before that key existed."""
    stated = {f"{key}=null" for key, old in ADDED.items() if old is None}
    return tuple(sorted(o for o in overrides if o not in stated))


def keep_old_names(
    old: SweepManifest, new: SweepManifest, configs: dict[str, "Config"]
) -> tuple[SweepManifest, dict[str, "Config"]]:
    """A job already in the manifest keeps its name and folder (a sweep named before the shared hash was
    dropped, or one whose shared overrides changed with the jobs added): the same overrides, the same run."""
    by_overrides = {same_run(j.overrides): j for j in old.jobs}
    jobs, kept = [], {}
    for job in new.jobs:
        before = by_overrides.get(same_run(job.overrides))
        if before is not None and before.name != job.name:
            kept[before.name] = configs[job.name]
            job = dataclasses.replace(job, name=before.name, run_dir=before.run_dir, log=before.log)
        else:
            kept[job.name] = configs[job.name]
        jobs.append(job)
    return dataclasses.replace(new, jobs=jobs), kept


def merge(old: SweepManifest, new: SweepManifest) -> SweepManifest:
    """The new command's manifest, keeping what the old one knew about the same jobs.

    Adding jobs is allowed (more seeds, a new mode), and so is leaving out a job that never started (a
    study's planned point made needless by the results so far); leaving out one that started is refused,
    so the manifest never stops describing a run or a log that sits in its folder.
    """
    known = {j.name: j for j in old.jobs}
    changed = next(
        (j for j in new.jobs if j.name in known and same_run(known[j.name].overrides) != same_run(j.overrides)), None
    )
    if changed:
        raise TiecliError(
            f"sweep {new.name!r}: job {changed.name!r} ran with `{' '.join(known[changed.name].overrides)}`, "
            f"not `{' '.join(changed.overrides)}`; re-run it with the same overrides (`{old.command}`) or pick another --name"
        )
    dropped = sorted(n for n in known.keys() - {j.name for j in new.jobs} if known[n].attempts > 0)
    if dropped:
        raise TiecliError(
            f"sweep {new.name!r} already has {len(dropped)} started job(s) this command leaves out (e.g. {dropped[0]!r}); "
            f"re-run it with the same overrides (`{old.command}`), give a new axis the value those jobs ran among "
            "its values, or pick another --name"
        )
    history = ("state", "exit_code", "error", "started", "ended", "attempts", "job_id")
    jobs = [
        dataclasses.replace(job, **{k: getattr(known[job.name], k) for k in history}) if job.name in known else job
        for job in new.jobs
    ]
    return dataclasses.replace(new, created=old.created, jobs=jobs)
