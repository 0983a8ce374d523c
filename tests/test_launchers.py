"""`tiecli sweep --launcher ...`: the submitit path run for real on this machine (submitit_local), the SLURM
settings as the sbatch lines submitit would submit, GPUs handed to jobs, and the one-line refusals."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY
from helpers import one_line_error, tiecli

from tiecli.run.layout import CHECKPOINT, CONFIG, LOCK, MANIFEST, OVERRIDES, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import read_manifest, write_manifest
from tiecli.sweep import launchers, plan, scheduler

# long jobs: two evaluations and a checkpoint every 50 steps, so that most of the time goes to training steps
LONG = [o for o in TINY if not o.startswith(("train.max_steps=", "train.checkpoint_interval="))]
LONG += ["train.checkpoint_interval=50", "train.evals=2", "diag.every=0"]


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _checkpointed(folder: Path, job: dict) -> bool:
    """The job trains and has saved its first checkpoint (step 50)."""
    reader = RunReader(folder / job["run_dir"])
    return (reader.path / CHECKPOINT).is_file() and reader.in_use()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the job's processes")
def test_submitit_local_runs_real_jobs_and_a_rerun_resumes_the_killed_and_the_preempted_one(isolated):
    # three jobs at once: a short one that completes, one whose trainer is killed (SIGKILL), and one
    # preempted as SLURM does it (SIGUSR2 to the job's process, which hands it on to `tiecli train`)
    args = ["sweep", *LONG, "train.max_steps=12,400,401", "--launcher", "submitit_local", "--jobs", "3"]
    args += ["--name", "cluster"]
    folder = isolated / "runs" / "sweeps" / "cluster"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiecli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        _wait(lambda: (folder / MANIFEST).exists(), 60, "the manifest")
        jobs = json.loads((folder / MANIFEST).read_text())["jobs"]
        _wait(lambda: _checkpointed(folder, jobs[1]), 120, "the second job's first checkpoint")
        os.kill(int((folder / jobs[1]["run_dir"] / LOCK).read_text()), signal.SIGKILL)
        _wait(lambda: _checkpointed(folder, jobs[2]), 120, "the third job's first checkpoint")
        trainer = int((folder / jobs[2]["run_dir"] / LOCK).read_text())
        job_process = int(Path(f"/proc/{trainer}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        os.kill(job_process, signal.SIGUSR2)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "1 completed, 1 failed, 1 interrupted" in out, out
    assert "stopped early (a time limit or preemption)" in out and "--launcher submitit_local" in out

    manifest = json.loads((folder / MANIFEST).read_text())
    done, failed, preempted = manifest["jobs"]
    assert manifest["command"].endswith("--launcher submitit_local --jobs 3")
    for job in manifest["jobs"]:  # submitit_local's job id: the pid of the job's controller process
        assert job["job_id"].isdigit() and (folder / "submitit" / f"{job['job_id']}_0_log.out").is_file()
        assert "# attempt 1, " in (folder / job["log"]).read_text()
    assert len({j["job_id"] for j in manifest["jobs"]}) == 3
    assert (done["state"], done["exit_code"]) == ("completed", 0)
    assert (failed["state"], failed["exit_code"]) == ("failed", -9) and "killed by SIGKILL" in failed["error"]
    assert (preempted["state"], preempted["exit_code"]) == ("interrupted", 130)
    stopped = RunReader(folder / preempted["run_dir"]).summary()
    assert stopped.status == "interrupted" and 50 <= stopped.step < 401
    kept = (folder / done["run_dir"] / SUMMARY).read_bytes()

    result = tiecli(*args)
    assert result.exit_code == 0 and "1 of 3 jobs already completed; skipping them" in result.output, result.output
    rerun = {j["name"]: j for j in json.loads((folder / MANIFEST).read_text())["jobs"]}
    assert (folder / done["run_dir"] / SUMMARY).read_bytes() == kept
    for old in (failed, preempted):
        job = rerun[old["name"]]
        assert (job["state"], job["attempts"]) == ("completed", 2) and job["job_id"] != old["job_id"]
        log = (folder / job["log"]).read_text()
        assert "# attempt 2" in log and "--resume" in log.split("# attempt 2")[1]
        assert RunReader(folder / job["run_dir"]).summary().step == int(job["overrides"][-1].split("=")[1])
    assert f"from step {stopped.step}" in (folder / preempted["log"]).read_text()


@pytest.mark.slow
def test_status_shows_a_sweep_without_running_it(isolated):
    folder, manifest, _ = plan.plan([*TINY, "seed=0,1"], None, Path("runs"), "shown")
    manifest.jobs[0].state, manifest.jobs[0].job_id = "running", "4242_0"  # submitted by a sweep that died
    folder.mkdir(parents=True)
    write_manifest(folder / MANIFEST, manifest)
    before = sorted(p.name for p in folder.iterdir())
    result = tiecli("sweep", "--status", "shown")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "nano-" in line]
    assert "pending" in rows[0] and "4242_0" in rows[0] and "pending" in rows[1]  # no such job alive: not running
    assert "job id" in result.output and result.output.rstrip().endswith("2 pending")
    assert sorted(p.name for p in folder.iterdir()) == before and not (folder / "logs").exists()
    one_line_error(tiecli("sweep", "--status", "nope"), 1, "no sweep 'nope' in 'runs/sweeps'; sweeps there: shown")
    one_line_error(tiecli("sweep", "seed=0", "--status", "shown"), 2, "--status shown shows a sweep")


@pytest.mark.slow
def test_slurm_settings_become_the_job_arrays_sbatch_lines(isolated):
    slurm = [
        "launcher.slurm.partition=gpu",
        "launcher.slurm.time=30",
        "launcher.slurm.mem=64G",
        "launcher.slurm.account=lab",
        "launcher.slurm.qos=high",
        "launcher.slurm.array_parallelism=2",
        "launcher.slurm.extra=['--constraint=a100','--exclusive']",
        "launcher.slurm.setup=['module load cuda']",
    ]
    args = ["sweep", *TINY, "seed=0,1,2", *slurm, "--launcher", "submitit_slurm", "--gpus-per-job", "2", "--name", "c"]
    result = tiecli(*args, "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "submitit_slurm: the 3 job(s) to run go to SLURM as one array with" in lines
    sbatch = {line.strip() for line in lines if line.strip().startswith("#SBATCH")}
    for expected in (
        "--partition=gpu",
        "--time=30",
        "--mem=64G",
        "--account=lab",
        "--qos=high",
        "--array=0-2%2",  # the three jobs, two at a time
        "--gpus-per-node=2",  # --gpus-per-job
        "--ntasks-per-node=1",
        "--cpus-per-task=8",  # conf/launcher/submitit_slurm.yaml's default
        "--signal=USR2@90",  # the warning before the time limit, on which tiecli train checkpoints
        "--constraint=a100",
        "--exclusive",
        "--job-name=tiecli-c",
    ):
        assert f"#SBATCH {expected}" in sbatch, (expected, sbatch)
    assert not Path("runs").exists()

    launch = scheduler.launch_options("submitit_slurm", slurm, None, None, 2)
    assert launch.settings.slurm and launch.settings.slurm.setup == ["module load cuda"]
    assert launchers.slurm_parameters(launch.settings, "c", 2)["setup"] == ["module load cuda"]
    # submitting needs SLURM itself: refused in one line here, before anything is written
    one_line_error(tiecli(*args), 1, "--launcher submitit_slurm needs a SLURM cluster, but sbatch and srun")
    assert not Path("runs").exists()


@pytest.mark.slow
def test_a_missing_submitit_is_one_line_naming_the_extra(isolated, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # what `import submitit` finds when it is not installed
    for launcher in ("submitit_local", "submitit_slurm"):
        one_line_error(
            tiecli("sweep", *TINY, "--launcher", launcher), 1, f"--launcher {launcher} needs submitit, which is not"
        )
        result = tiecli("sweep", *TINY, "--launcher", launcher)
        assert "pip install 'tiecli[cluster]'" in result.output
    assert not Path("runs").exists()


def test_bad_launcher_options_exit_2(isolated, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs, whatever the machine has
    one_line_error(
        tiecli("sweep", *TINY, "--launcher", "nope"),
        2,
        "unknown --launcher 'nope'; valid launchers: basic, submitit_local, submitit_slurm",
    )
    one_line_error(
        tiecli("sweep", *TINY, "launcher.slurm.partition=gpu"),
        2,
        "unknown config key 'launcher.slurm'; valid keys under 'launcher': local",
    )
    one_line_error(
        tiecli("sweep", *TINY, "--launcher", "submitit_slurm", "launcher.slurm.time=soon", "--dry-run"),
        2,
        "launcher.slurm.time='soon' has the wrong type; expected int",
    )
    one_line_error(
        tiecli("sweep", *TINY, "--launcher", "submitit_slurm", "launcher.slurm.extra=[constraint]", "--dry-run"),
        2,
        "launcher.slurm.extra line 'constraint' is not an sbatch option such as --constraint=a100",
    )
    one_line_error(tiecli("sweep", *TINY, "--launcher", "submitit_slurm", "--jobs", "4"), 2, "set that instead")
    one_line_error(tiecli("sweep", *TINY, "--gpus-per-job", "2"), 2, "--gpus-per-job 2 but this machine has 0 GPU(s)")
    assert not Path("runs").exists()


@pytest.mark.slow
def test_each_concurrent_job_gets_its_own_gpu_round_robin(isolated, monkeypatch):
    pool = launchers.GpuPool(["0", "1", "2", "3"], 1)
    assert [pool.take() for _ in range(5)] == ["0", "1", "2", "3", "0"]  # a fifth job shares the least used
    pool.give_back("2")
    assert pool.take() == "2"
    pairs = launchers.GpuPool(["0", "1", "2", "3"], 2)
    assert [pairs.take(), pairs.take()] == ["0,1", "2,3"]
    assert launchers.check_gpus(["0", "1"], 1, 2) is None
    assert "some jobs share a GPU" in launchers.check_gpus(["0", "1"], 1, 3)

    # the devices the sweep may use are CUDA_VISIBLE_DEVICES's; each running job gets one of them
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    result = tiecli("sweep", *TINY, "seed=0,1", "--jobs", "2", "--name", "gpus")
    assert result.exit_code == 0, result.output
    assert "GPU 3)" in result.output and "GPU 5)" in result.output
    folder = isolated / "runs" / "sweeps" / "gpus"
    manifest = read_manifest(folder / MANIFEST)
    given = [
        re.search(r"# attempt 1, \S+ on CUDA_VISIBLE_DEVICES=(\S+): ", (folder / j.log).read_text())
        for j in manifest.jobs
    ]
    assert sorted(m[1] for m in given if m) == ["3", "5"]


def test_the_job_command_resumes_a_started_run_and_uses_torchrun_for_several_gpus(isolated):
    spec = launchers.JobSpec(
        name="run", overrides=["seed=1"], sweep_dir=str(isolated), log="logs/run.log", config_dir=None,
        attempt=1, nproc=1, gpus=None, threads=None,
    )  # fmt: skip
    command = launchers.train_command(spec)
    assert command == [sys.executable, "-m", "tiecli", "train", "--runs-dir", str(isolated), "--name", "run"] + [
        "--",
        "seed=1",
    ]
    (isolated / "run").mkdir()
    for file in (CONFIG, OVERRIDES):  # a run directory: the job resumes it
        (isolated / "run" / file).write_text("seed: 1\n")
    spec.nproc, spec.config_dir = 2, "/my/conf"
    assert launchers.train_command(spec)[8:] == ["--nproc", "2", "--resume", "--config-dir", "/my/conf", "--", "seed=1"]


def test_a_job_across_nodes_gets_nodes_srun_cpus_and_one_rendezvous(isolated, monkeypatch):
    """launcher.slurm.nodes=2: #SBATCH --nodes=2 with one task a node, srun told --cpus-per-task again (it
    does not inherit it on Slurm 22.05-23.02), and each node's torchrun meeting at the allocation's first host."""
    args = ["sweep", *TINY, "seed=0,1", "--launcher", "submitit_slurm", "launcher.slurm.nodes=2", "--gpus-per-job", "4"]
    result = tiecli(*args, "--name", "multi", "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    for expected in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4"):
        assert expected in lines, (expected, lines)
    srun = next(line for line in lines if line.startswith("srun "))
    assert " --cpus-per-task=8" in srun and " --unbuffered " in srun
    assert not Path("runs").exists()

    # on the nodes: `scontrol show hostnames` names the allocation's hosts, the first holds the rendezvous
    bin_dir = isolated / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {isolated}/asked\necho gpu-a17\necho gpu-a18\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_JOB_ID": "81234"}
    rendezvous = launchers.slurm_rendezvous(env)
    assert (isolated / "asked").read_text().split() == ["show", "hostnames", "gpu-a[17-18]"]
    assert rendezvous == launchers.Rendezvous(2, "gpu-a17:30734", "81234")  # 29500 + 81234 % 10000
    assert launchers.slurm_rendezvous({"SLURM_NNODES": "1"}) is None
    assert launchers.slurm_rendezvous({}) is None

    spec = launchers.JobSpec(
        name="run", overrides=["seed=1"], sweep_dir=str(isolated), log="logs/run.log", config_dir=None,
        attempt=1, nproc=4, gpus=None, threads=None,
    )  # fmt: skip
    assert launchers.train_command(spec, rendezvous) == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-a17:30734", "--rdzv-id=81234", "-m", "tiecli", "train",
        "--runs-dir", str(isolated), "--name", "run", "--", "seed=1",
    ]  # fmt: skip


def test_node_and_task_counts_through_extra_are_refused(isolated):
    for line in ("--nodes=2", "--ntasks=4", "--ntasks-per-node=2"):
        one_line_error(
            tiecli("sweep", *TINY, "--launcher", "submitit_slurm", f"launcher.slurm.extra=['{line}']", "--dry-run"),
            2,
            f"launcher.slurm.extra line '{line}' would start independent runs writing one run directory; "
            "use launcher.slurm.nodes=N",
        )
    one_line_error(
        tiecli("sweep", *TINY, "--launcher", "submitit_slurm", "launcher.slurm.nodes=0", "--dry-run"),
        2,
        "launcher.slurm.nodes=0 must be at least 1",
    )
    assert not Path("runs").exists()


def test_a_slurm_job_sizes_its_threads_from_its_allocation_not_the_node(isolated, monkeypatch):
    """run_job on a node of 64 cores whose allocation is 8 (sched_getaffinity): 8 threads shared by 2 ranks."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_NNODES", raising=False)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # run_job's handlers stay out of pytest
    started = []

    class Done:
        def wait(self):
            return 0

    monkeypatch.setattr(launchers, "start", lambda spec, rendezvous=None: started.append((spec, rendezvous)) or Done())
    spec = launchers.JobSpec(
        name="run", overrides=[], sweep_dir=str(isolated), log="logs/run.log", config_dir=None,
        attempt=1, nproc=2, gpus=None, threads=None,
    )  # fmt: skip
    assert launchers.cpu_cores() == 8
    assert launchers.run_job(spec) == 0
    assert started[0][0].threads == 4 and started[0][1] is None
