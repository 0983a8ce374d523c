# Used by `tiecli sweep`: runs the jobs not yet completed, --jobs at a time or as one SLURM job array.
"""Running a sweep: each job a separate `tiecli train` process, started by its launcher (launchers.py).

A crash or an out-of-memory kill ends that job, not the sweep; the sweep's death (even kill -9)
stops its jobs, which checkpoint first (Linux). Running again skips completed runs (their
summary.json says so), resumes interrupted ones from their checkpoint and retries failed ones.
The first Ctrl-C (or SIGTERM, SIGHUP) asks every running job to checkpoint and stop; the second
kills them. The sweep holds runs/sweeps/<name>/.lock (flock) while it runs: one sweep at a time per folder.
"""

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

import tiecli.sweep.launchers as launchers
import tiecli.sweep.manifest as manifests
from tiecli.config.compose import compose_launcher
from tiecli.config.schema import LauncherConfig
from tiecli.errors import ConfigError, TiecliError
from tiecli.formats import PLAIN_EVERY_S
from tiecli.run.files import Lock, now
from tiecli.run.layout import CHECKPOINT, LOCK, is_run_dir
from tiecli.run.reader import RunReader
from tiecli.run.records import SweepJob, SweepManifest
from tiecli.sweep.plan import split_launcher_overrides
from tiecli.sweep.states import SET_ASIDE, current_state, finish, last_error_line, read_live
from tiecli.sweep.status import PlainProgress, Watch, announce, jobs_table, show_counts, shown


@dataclasses.dataclass
class Launch:
    """How the jobs run: `--launcher` and its settings (conf/launcher/NAME.yaml), `--jobs`, `--gpus-per-job`."""

    name: str
    settings: LauncherConfig
    parallel: int = 1
    gpus_per_job: int | None = None
    gpus: list[str] = dataclasses.field(default_factory=list)  # this machine's, for basic and submitit_local


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


def run(
    sweep_dir: Path,
    manifest: SweepManifest,
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
    with Lock(sweep_dir / LOCK, f"sweep {manifest.name}"):
        manifest, todo = _prepare(sweep_dir, manifest, console)
        starter = Starter(sweep_dir, manifest, launch, console)
        stopped = _run_jobs(sweep_dir, manifest, todo, launcher, starter, console, every)
    return _conclude(console, manifest, sweep_dir, stopped)


class Starter:
    """Turns a job into the JobSpec of its next attempt: its GPUs (round-robin), threads and torchrun processes."""

    def __init__(self, sweep_dir: Path, manifest: SweepManifest, launch: Launch, console: Console):
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

    def spec(self, job: SweepJob) -> launchers.JobSpec:
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


def _prepare(sweep_dir: Path, manifest: SweepManifest, console: Console) -> tuple[SweepManifest, list[SweepJob]]:
    """Under the sweep's lock: the manifest as it stands now, each job's state from its run, and the jobs to run."""
    old = manifests.read(sweep_dir)
    if old:  # plan() read it before the lock was ours: a sweep that ended meanwhile may have changed it
        manifest = manifests.merge(old, manifest)
    for job in manifest.jobs:
        if job.state == "running" and launchers.still_active(job.job_id, sweep_dir):
            raise TiecliError(
                f"sweep {manifest.name}: job {job.name} ({job.job_id}) from an earlier submission is still queued "
                f"or running; `tiecli sweep --status {manifest.name}` shows it; wait for it, or cancel it first"
            )
        job.state = current_state(job, sweep_dir)
    todo = [j for j in manifest.jobs if j.state != "completed"]
    for job in todo:
        _check_free(sweep_dir / job.run_dir, job.name, manifest.name)
    for job in todo:
        _set_aside_unresumable(sweep_dir, job, manifest.name, console)
    before = {j.name for j in old.jobs} if old else set()
    added = [j.name for j in manifest.jobs if j.name not in before]
    left_out = sorted(before - {j.name for j in manifest.jobs})  # manifests.merge lets only unstarted ones go
    if old and added:
        console.print(f"sweep {manifest.name!r}: {len(added)} new job(s) added to the {len(old.jobs)} in its manifest")
    if left_out:
        console.print(
            f"sweep {manifest.name!r}: {len(left_out)} job(s) that never started left out (e.g. {left_out[0]!r})"
        )
    if len(todo) < len(manifest.jobs):
        console.print(f"{len(manifest.jobs) - len(todo)} of {len(manifest.jobs)} jobs already completed; skipping them")
    return manifest, todo


def _check_free(run_dir: Path, name: str, sweep: str) -> None:
    """Refuse a run another process is writing (a trainer a killed sweep left, a `tiecli train --resume`): a second trainer would corrupt it."""
    if RunReader(run_dir).in_use():
        try:  # taking the lock fails naming its holder, as a second `tiecli train` would; if it was just freed, fine
            Lock(run_dir / LOCK, f"run {name}").acquire().release()
        except TiecliError as e:
            raise TiecliError(f"sweep {sweep}: {e}") from None


def _set_aside_unresumable(sweep_dir: Path, job: SweepJob, sweep: str, console: Console) -> None:
    """A job whose run trained steps but has no checkpoint (a full disk before the first) cannot resume,
    and a sweep cannot give it another --name: its run moves to SET_ASIDE, and the job starts from step 0."""
    run_dir = sweep_dir / job.run_dir
    reader = RunReader(run_dir)
    if not is_run_dir(run_dir) or (run_dir / CHECKPOINT).is_file():
        return
    summary = read_live(reader.summary, None)
    if summary is None or summary.status == "completed" or summary.step == 0:  # step 0: the resume restarts it
        return
    aside, n = sweep_dir / SET_ASIDE / f"{Path(job.run_dir).name}.{job.attempts}", job.attempts
    while aside.exists():
        n += 1
        aside = aside.with_name(f"{Path(job.run_dir).name}.{n}")
    aside.parent.mkdir(parents=True, exist_ok=True)
    with Lock(run_dir / LOCK, f"run {job.name}"):
        os.rename(run_dir, aside)  # the lock file goes with it, still locked by us until the end of this block
    console.print(
        f"sweep {sweep}: job {job.name} trained to step {summary.step} but left no checkpoint to resume from; "
        f"it starts again from step 0 (its records are kept in {shown(aside)})",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _run_jobs(
    sweep_dir: Path,
    manifest: SweepManifest,
    todo: list[SweepJob],
    launcher,
    starter: Starter,
    console: Console,
    every: float,
) -> bool:
    """Launch and reap the jobs, saving the manifest at every change; returns whether a signal stopped the sweep."""
    jobs = manifest.jobs

    running: dict[str, launchers.Running] = {}  # job name -> what its launcher started
    signals = []  # the handler only records; the loop forwards, so a job launched meanwhile is not missed
    stopped = 0
    manifests.save(sweep_dir, manifest)
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
                    manifests.save(sweep_dir, manifest)
                    for job in batch:
                        announce(console, job, jobs, sweep_dir, watch.gpus.get(job.name))
                for job in _reap(jobs, running, launcher, starter, bool(signals), sweep_dir):
                    manifests.save(sweep_dir, manifest)
                    announce(console, job, jobs, sweep_dir, None)
                if plain:
                    plain.tick([j for j in jobs if j.name in running])
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for started in running.values():  # only after an error in the sweep itself: stop the orphans cleanly
            launcher.stop(started.handle, hard=False)
    manifests.save(sweep_dir, manifest)
    if console.is_terminal:
        console.print(jobs_table(jobs, watch))
    return bool(signals)


def _reap(jobs, running: dict, launcher, starter: Starter, stopping: bool, sweep_dir: Path) -> list[SweepJob]:
    """The running jobs that have ended, each taken out of `running` and its state recorded."""
    ended_jobs = []
    for job in [j for j in jobs if j.name in running]:
        ended, code = launcher.poll(running[job.name].handle)
        if ended:
            started = running.pop(job.name)
            starter.done(started)
            finish(job, code, stopping, sweep_dir, started.offset)
            ended_jobs.append(job)
    return ended_jobs


def _submit(
    batch: list[SweepJob], launcher, starter: Starter, running: dict[str, launchers.Running], sweep_dir: Path
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


def _conclude(console: Console, manifest: SweepManifest, sweep_dir: Path, stopped: bool) -> int:
    jobs = manifest.jobs
    counts = show_counts(console, manifest, sweep_dir)
    for job in jobs:
        if job.state == "failed":
            console.print(
                f"failed: {job.name}: {last_error_line(job)} (log: {shown(sweep_dir / job.log)})",
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
