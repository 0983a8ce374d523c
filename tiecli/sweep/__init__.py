# Used by `tiecli sweep`: expand a grid of overrides, run each job as its own `tiecli train` process.
"""A sweep: the Cartesian product of Hydra sweep overrides, run job by job, resumable.

runs/sweeps/<name>/
  sweep.json     the manifest: command, axes, fixed overrides and every job's state, rewritten
                 atomically after each change, so it is true whenever the sweep stops
  logs/<job>.log each job's stdout and stderr, every attempt appended (a job that fails before it
                 creates its run directory still has something to say)
  <job>/         each job's run directory, named by config.run_name, written by `tiecli train`
  .lock          held (flock) by the sweep while it runs: one sweep at a time per folder

Where each part lives:
  study.py       conf/study/NAME.yaml: axes, fixed settings, `when` and `add` rules, Holm families
  plan.py        the overrides expanded into named jobs, the sweep's name and folder: the plan
  manifest.py    sweep.json: reading, merging a re-run's plan into it, saving
  scheduler.py   running the jobs: --launcher, --jobs, GPUs, the lock, signals, the exit code
  launchers.py   basic, submitit_local, submitit_slurm: how a job's `tiecli train` starts
  states.py      a job's state from its exit code and its run directory; a failed job's error
  status.py      the live table, the plain progress lines and `--status`
  dryrun.py      `--dry-run`: each job's size and the wall-time estimate
"""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a submitit job imports this package (for launchers.run_job): it needs no Hydra, torch or rich
    from rich.console import Console


def sweep(
    overrides: list[str],
    *,
    name: str | None,
    status: str | None,
    launcher: str,
    jobs: int | None,
    gpus_per_job: int | None,
    runs_dir: Path,
    config_dir: Path | None,
    dry_run: bool,
    estimate: bool,
    console: "Console",
    err_console: "Console",
) -> int:
    """`tiecli sweep`: show a sweep's status, print its dry run or run it; the exit code."""
    from tiecli.errors import ConfigError
    from tiecli.sweep import plan, scheduler
    from tiecli.sweep.status import Ticker, show_status
    from tiecli.sweep.study import unmatched

    if status is not None:
        if overrides:
            raise ConfigError(f"--status {status} shows a sweep; give it no overrides ({overrides[0]!r})")
        show_status(runs_dir, status, console)
        return 0
    launch = scheduler.launch_options(launcher, overrides, config_dir, jobs, gpus_per_job)
    options = scheduler.launch_command(launch, jobs)
    composing = Ticker(err_console, "composing and checking the jobs' configs")
    sweep_dir, manifest, configs = plan.plan(overrides, config_dir, runs_dir, name, options, composing)
    for note in unmatched(manifest.study, [job.overrides for job in manifest.jobs]):
        err_console.print(note, highlight=False, markup=False, soft_wrap=True)
    if dry_run:
        from tiecli.sweep.dryrun import dry_run_lines  # torch: only to size and time the jobs

        # each line as it comes: the jobs at once, then what the timing is doing while it runs
        for line in dry_run_lines(sweep_dir, manifest, configs, launch, estimate, err_console):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        return 0
    return scheduler.run(sweep_dir, manifest, launch.parallel, console, launch=launch)
