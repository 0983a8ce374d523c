# Used by `tiecli sweep` and `tiecli sweep --status`: each job's state, from its exit code and its run directory.
"""A job's state: pending, running, completed, failed or interrupted, as sweep.json records it.

The run directory is the truth once no process of the job runs: its summary.json says completed,
interrupted or running (a sweep killed outright leaves running there). A job that ended records
its exit code; a failed one the last lines its attempt wrote to its log (logs/<job>.log).
"""

import signal
from pathlib import Path

from tiecli.errors import TiecliError
from tiecli.run.files import now
from tiecli.run.reader import RunReader
from tiecli.run.records import SweepJob

ERROR_TAIL_LINES = 5
SET_ASIDE = ".set-aside"  # a sweep folder's runs that could not resume (no checkpoint), kept as they were


def read_live(read, default):
    """A run's file while `tiecli train` may be writing it: absent or unreadable for now reads as `default`."""
    try:
        return read()
    except TiecliError:
        return default


def run_status(run_dir: Path) -> str | None:
    """The run's status (RunReader.status), None while it has none or it cannot be read yet."""
    return read_live(RunReader(run_dir).status, None)


def current_state(job: SweepJob, sweep_dir: Path) -> str:
    """A job's state once no process of it runs: the run directory is the truth (a run deleted since, or a
    sweep killed outright, shows up here)."""
    status = run_status(sweep_dir / job.run_dir)
    if status == "completed":
        return "completed"
    if job.state in ("running", "completed"):
        return "interrupted" if status else "pending"
    return job.state


def finish(job: SweepJob, code: int | None, stopping: bool, sweep_dir: Path, offset: int) -> None:
    """The job's state from its exit code: 0 completed, 130 (or stopped by us) interrupted, else failed.

    A job that ended without a code (its submitit job was killed, or failed on the cluster) has the state
    its run directory shows: completed, interrupted, or else failed.
    """
    status = run_status(sweep_dir / job.run_dir) if code is None else None
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


def last_error_line(job: SweepJob) -> str:
    lines = (job.error or "").splitlines()
    return next(
        (line for line in reversed(lines) if line.startswith("error:")),
        lines[-1] if lines else f"exit code {job.exit_code}",
    )
