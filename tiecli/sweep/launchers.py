# Used by `tiecli sweep --launcher basic|submitit_local|submitit_slurm`: where and how each job of a sweep runs.
"""Launchers run a sweep's jobs; the sweep keeps the manifest (sweep.json) and decides what to run.

basic           each job is a `tiecli train` subprocess of the sweep (the default)
submitit_local  each job goes through submitit's local executor: a controller process that outlives the sweep
submitit_slurm  the jobs go to SLURM through submitit, as one job array (needs pip install 'tiecli[cluster]')

Every launcher runs the same command for a job (train_command): `tiecli train --name JOB --resume` when the
run directory exists at the job's start, plain `tiecli train --name JOB` otherwise, under torchrun when a job
has several GPUs, with its output appended to logs/<job>.log. Under submitit the job is `run_job`, which
starts that command and hands it the stop signals: SIGUSR2 (SLURM's warning before the time limit),
SIGTERM (preemption, scancel) and SIGINT. `tiecli train` then checkpoints, marks the run interrupted and
exits 130, so the next submission of the sweep resumes it.
"""

import contextlib
import ctypes
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiecli.errors import ConfigError, TiecliError
from tiecli.run.files import now
from tiecli.run.layout import is_run_dir

if TYPE_CHECKING:  # a submitit job imports this module to run run_job: it needs neither torch nor Hydra
    from tiecli.config.schema import LauncherConfig

CLUSTER_EXTRA = "pip install 'tiecli[cluster]'"
SUBMITIT_FOLDER = "submitit"  # inside the sweep folder: submitit's pickles and its own logs, per job id
PR_SET_PDEATHSIG = 1  # linux/prctl.h
RDZV_PORT = 29500  # + the job id modulo 10000: a multi-node job's rendezvous port on its first node
ACTIVE_SLURM_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING")


@dataclasses.dataclass
class JobSpec:
    """One attempt at one job, as the launcher hands it to the process that starts `tiecli train`."""

    name: str
    overrides: list[str]
    sweep_dir: str  # absolute: a cluster job starts elsewhere
    log: str  # relative to sweep_dir
    config_dir: str | None
    attempt: int
    nproc: int  # ranks under torchrun (`tiecli train --nproc`), one per GPU; 1: no torchrun
    gpus: str | None  # CUDA_VISIBLE_DEVICES for the job; None: leave it as the job finds it
    threads: int | None  # OMP_NUM_THREADS; None: leave it


@dataclasses.dataclass
class Rendezvous:
    """Where the torchruns of a job across several nodes meet: the first node of the allocation."""

    nodes: int
    endpoint: str  # host:port
    run_id: str


def train_command(spec: JobSpec, rendezvous: Rendezvous | None = None) -> list[str]:
    """The job's command line, decided when the job starts: a queued job whose run began meanwhile resumes it.

    With a rendezvous (a SLURM job across several nodes) each node runs torchrun itself, its agents
    meeting at the first node's endpoint, so the nodes train one run; otherwise `tiecli train --nproc`
    starts a single-node torchrun. The resume decision is taken before the rendezvous, so every node takes
    the same one: no rank runs before all nodes have joined."""
    sweep_dir = Path(spec.sweep_dir)
    if rendezvous is None:
        command = [sys.executable, "-m", "tiecli", "train"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={rendezvous.nodes}"]
        command += [f"--nproc-per-node={spec.nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous.endpoint}"]
        command += [f"--rdzv-id={rendezvous.run_id}", "-m", "tiecli", "train"]
    command += ["--runs-dir", str(sweep_dir), "--name", spec.name]
    command += (
        ["--nproc", str(spec.nproc)] if spec.nproc > 1 and rendezvous is None else []
    )  # torchrun, one rank per GPU
    command += ["--resume"] if is_run_dir(sweep_dir / spec.name) else []
    command += ["--config-dir", spec.config_dir] if spec.config_dir else []
    return command + ["--", *spec.overrides]  # "--": an override can never be read as an option


def slurm_rendezvous(env: dict[str, str]) -> Rendezvous | None:
    """The rendezvous of a SLURM job across several nodes (SLURM_NNODES > 1); None for one node.

    The endpoint is the allocation's first host (`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`),
    at a port drawn from the job id, so that two jobs sharing a node do not meet at the same port."""
    nodes = int(env.get("SLURM_NNODES") or 1)
    if nodes <= 1:
        return None
    listed = subprocess.run(
        ["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True, check=True
    )
    job_id = env["SLURM_JOB_ID"]
    return Rendezvous(nodes, f"{listed.stdout.split()[0]}:{RDZV_PORT + int(job_id) % 10000}", job_id)


def cpu_cores() -> int:
    """The cores this process may run on: a SLURM allocation's (--cpus-per-task), not the node's os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no affinity mask
        return os.cpu_count() or 1


def start(spec: JobSpec, rendezvous: Rendezvous | None = None) -> subprocess.Popen:
    """Start the job's `tiecli train`, its output appended to its log under a header line for this attempt."""
    command = train_command(spec, rendezvous)
    log_path = Path(spec.sweep_dir) / spec.log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {"COLUMNS": "200", **os.environ}  # job logs are files: rich would wrap them at 80 columns
    where = ""
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec.gpus
        where = f" on CUDA_VISIBLE_DEVICES={spec.gpus}"
    if spec.threads is not None:
        env["OMP_NUM_THREADS"] = str(spec.threads)
    with open(log_path, "a") as log:
        log.write(f"\n# attempt {spec.attempt}, {now()}{where}: {shlex.join(command[1:])}\n")
        log.flush()
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only, which passes one stop on
            preexec_fn=_stop_with_parent(),
        )


def _stop_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send the job SIGTERM when its parent (the sweep, or submitit's job) dies.

    Jobs run in their own session, so nothing else would stop them: an orphan would train on, and a
    re-run would find its run in use. SIGTERM makes `tiecli train` checkpoint and stop. A preexec_fn is
    unsafe in a threaded process (the live table's) only if it takes a lock another thread may hold;
    this one calls prctl and getppid.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl  # looked up here: between fork and exec the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl: no signal will come, stop now
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def run_job(spec: JobSpec) -> int:
    """What a submitit job runs: one `tiecli train`, with SIGUSR2, SIGTERM and SIGINT passed on as SIGTERM; its exit code.

    These handlers replace submitit's own (which would requeue or kill the job): `tiecli train` saves the
    checkpoint and exits 130, and the next submission resumes it. SIGTERM, not the signal itself: one
    meaning for every stop (a second SIGINT would kill `tiecli train` outright).

    On a SLURM node the job's threads come from its allocation (cpu_cores), shared by its ranks,
    and a job across several nodes runs torchrun on each, meeting at the first (slurm_rendezvous).
    """
    if spec.threads is None and "OMP_NUM_THREADS" not in os.environ:
        spec = dataclasses.replace(spec, threads=max(1, cpu_cores() // spec.nproc))
    proc = start(spec, slurm_rendezvous(dict(os.environ)))

    def forward(signum, frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return proc.wait()


# --- GPUs --------------------------------------------------------------------------------------------


def visible_gpus() -> list[str]:
    """The GPUs this machine lets the sweep use: CUDA_VISIBLE_DEVICES's entries when set, else every CUDA device."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip() and not g.strip().startswith("-")]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class GpuPool:
    """Hands each starting job `per_job` GPUs: the least used, round-robin among equals, so with
    --jobs N <= GPUs / per_job every running job has GPUs of its own."""

    def __init__(self, gpus: list[str], per_job: int):
        self.gpus, self.per_job, self.next = gpus, per_job, 0
        self.users = dict.fromkeys(gpus, 0)

    def take(self) -> str | None:
        if not self.gpus:
            return None
        order = self.gpus[self.next :] + self.gpus[: self.next]
        chosen = sorted(order, key=lambda g: self.users[g])[: self.per_job]  # a stable sort keeps round-robin order
        for g in chosen:
            self.users[g] += 1
        self.next = (self.gpus.index(chosen[-1]) + 1) % len(self.gpus)
        return ",".join(sorted(chosen, key=self.gpus.index))

    def give_back(self, gpus: str | None) -> None:
        for g in (gpus or "").split(",") if gpus else []:
            self.users[g] -= 1


def check_gpus(gpus: list[str], per_job: int, parallel: int) -> str | None:
    """On this machine: --gpus-per-job beyond its GPUs is refused; a line when running jobs must share GPUs."""
    if per_job > len(gpus):
        raise ConfigError(
            f"--gpus-per-job {per_job} but this machine has {len(gpus)} GPU(s) "
            f"({', '.join(gpus) or 'none'}); give at most {len(gpus)}, or use --launcher submitit_slurm"
        )
    if gpus and parallel * per_job > len(gpus):
        return f"--jobs {parallel} x {per_job} GPU(s) per job on {len(gpus)} GPU(s): some jobs share a GPU"
    return None


# --- the launchers -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Running:
    """A job the launcher started: its handle (a Popen or a submitit Job), id, GPUs and where its log grew from."""

    handle: Any
    job_id: str | None
    gpus: str | None
    offset: int


class Basic:
    """Each job a subprocess of the sweep; stopping it is SIGINT (it checkpoints and exits 130), killing it SIGKILL."""

    name = "basic"
    all_at_once = False  # jobs start as slots free up, --jobs at a time

    def submit(self, specs: list[JobSpec]) -> list[tuple[Any, str | None]]:
        return [(start(spec), None) for spec in specs]

    def poll(self, handle: subprocess.Popen) -> tuple[bool, int | None]:
        code = handle.poll()
        return code is not None, code

    def stop(self, handle: subprocess.Popen, hard: bool) -> None:
        with contextlib.suppress(ProcessLookupError):
            handle.kill() if hard else handle.send_signal(signal.SIGINT)


class Submitit:
    """Jobs through submitit: `cluster` local (a controller process per job) or slurm (one job array per submission)."""

    def __init__(self, name: str, folder: Path, settings: "LauncherConfig", gpus_per_job: int | None):
        self.submitit = import_submitit(name)
        self.name, self.all_at_once = name, settings.kind == "submitit_slurm"
        if self.all_at_once:
            if not (_which("sbatch") and _which("srun")):
                raise TiecliError(
                    "--launcher submitit_slurm needs a SLURM cluster, but sbatch and srun are not on PATH here; "
                    "--launcher submitit_local runs the same jobs on this machine"
                )
            self.executor = self.submitit.SlurmExecutor(folder=folder)
            self.executor.update_parameters(**slurm_parameters(settings, folder.parent.name, gpus_per_job))
        else:
            local = settings.local
            assert local is not None and local.timeout_min is not None and local.signal_delay_s is not None
            self.executor = self.submitit.LocalExecutor(folder=folder)
            self.executor.update_parameters(timeout_min=local.timeout_min, signal_delay_s=local.signal_delay_s)

    def submit(self, specs: list[JobSpec]) -> list[tuple[Any, str | None]]:
        try:
            if self.all_at_once:
                with self.executor.batch():  # one SLURM job array
                    jobs = [self.executor.submit(run_job, spec) for spec in specs]
            else:
                jobs = [self.executor.submit(run_job, spec) for spec in specs]
        except Exception as e:  # sbatch refused (a bad partition, account or limit): its own words, one line
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            raise TiecliError(f"--launcher {self.name}: submitting {len(specs)} job(s) failed: {reason}") from None
        return [(job, str(job.job_id)) for job in jobs]

    def poll(self, job) -> tuple[bool, int | None]:
        """Ended, and run_job's exit code (None when the job ended without one: killed, or a cluster failure)."""
        if not job.done():
            return False, None
        try:
            return True, int(job.result())
        except Exception:  # submitit raises what the job raised, or UncompletedJobError: the run directory tells
            return True, None

    def stop(self, job, hard: bool) -> None:
        if hard:
            job.cancel(check=False)
        elif self.all_at_once:  # SIGUSR2 to the job's steps, as before a time limit
            subprocess.call(["scancel", "--signal=USR2", str(job.job_id)])
        else:  # the local controller passes SIGTERM on to the job, and run_job to `tiecli train`
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(job.job_id), signal.SIGTERM)


def make(name: str, sweep_dir: Path, settings: "LauncherConfig", gpus_per_job: int | None):
    """The launcher called `name` (of settings.kind); submitit's are refused in one line when submitit or SLURM is missing."""
    if settings.kind == "basic":
        return Basic()
    return Submitit(name, sweep_dir / SUBMITIT_FOLDER, settings, gpus_per_job)


def import_submitit(launcher: str):
    try:
        import submitit
    except ImportError:
        raise TiecliError(
            f"--launcher {launcher} needs submitit, which is not installed; install it with {CLUSTER_EXTRA}"
        ) from None
    return submitit


def _which(program: str) -> bool:
    return any(os.access(Path(d) / program, os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def slurm_parameters(settings: "LauncherConfig", sweep_name: str, gpus_per_job: int | None) -> dict:
    """launcher.slurm.* as submitit's SlurmExecutor parameters (each becomes an #SBATCH line)."""
    s = settings.slurm
    assert s is not None
    extra: dict[str, str | bool] = {}  # --constraint=a100 -> {"constraint": "a100"}; a bare --flag -> True
    for line in s.extra:
        key, _, value = line[2:].partition("=")
        extra[key] = value or True
    params = {
        "job_name": f"tiecli-{sweep_name}",
        "partition": s.partition,
        "time": s.time,
        "gpus_per_node": gpus_per_job if gpus_per_job is not None else s.gpus_per_node,
        "cpus_per_task": s.cpus_per_task,
        "mem": s.mem,
        "array_parallelism": s.array_parallelism,
        "account": s.account,
        "qos": s.qos,
        "signal_delay_s": s.signal_delay_s,
        "nodes": s.nodes,
        "ntasks_per_node": 1,  # one `tiecli train` (or one torchrun, which starts a process per GPU) a node
        # Slurm 22.05-23.02's srun does not inherit sbatch's --cpus-per-task (SRUN_CPUS_PER_TASK): say it again
        "srun_args": [f"--cpus-per-task={s.cpus_per_task}"] if s.cpus_per_task else None,
        "stderr_to_stdout": True,
        "setup": list(s.setup) or None,
        "additional_parameters": extra or None,
    }
    return {k: v for k, v in params.items() if v is not None and not (k == "gpus_per_node" and v == 0)}


def sbatch_lines(params: dict, jobs: int, folder: Path) -> list[str]:
    """The #SBATCH lines submitit would submit the array of `jobs` jobs with, and its srun line (for --dry-run)."""
    submitit = import_submitit("submitit_slurm")
    text = submitit.slurm.slurm._make_sbatch_string(command="", folder=folder, map_count=jobs, **params)
    return [line.strip() for line in text.splitlines() if line.startswith(("#SBATCH", "srun"))]


def still_active(job_id: str | None, sweep_dir: Path) -> bool:
    """Whether a job an earlier sweep submitted is still queued or running: a submitit_local controller
    process (its id is its pid), or a SLURM job that sacct lists as active."""
    if not job_id:
        return False
    if job_id.isdigit():
        with contextlib.suppress(OSError):
            if b"submitit" in Path(f"/proc/{job_id}/cmdline").read_bytes():
                return True
    if not _which("sacct"):
        return False
    try:
        submitit = import_submitit("submitit_slurm")
        state = submitit.SlurmJob(sweep_dir / SUBMITIT_FOLDER, job_id).get_info(mode="force").get("State", "")
    except Exception:  # sacct unreachable: nothing known to be active
        return False
    return str(state).split(" ")[0] in ACTIVE_SLURM_STATES
