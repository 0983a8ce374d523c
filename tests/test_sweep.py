"""`tiecli sweep` driven as a user drives it: dry runs for the grid, real sweeps of tiny jobs for the rest."""

import io
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY
from helpers import one_line_error, tiecli
from rich.console import Console

import tiecli.sweep.manifest as manifests
from tiecli.config.compose import default_config_dir
from tiecli.run.layout import MANIFEST, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import SweepJob, read_manifest
from tiecli.sweep import dryrun, plan, scheduler, status

TEXT = "".join(f"line {i}: the quick brown fox jumps over {i % 7} lazy dogs.\n" for i in range(2000))
NODATA = [o for o in TINY if not o.startswith(("data=", "data."))]  # for tests that pick their own corpus


def dry_run(*args) -> list[list[str]]:
    """Each job's overrides, in the order the dry run lists them."""
    result = tiecli("sweep", *args, "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    return [line.split("]: ", 1)[1].split() for line in result.output.splitlines() if "]: " in line]


@pytest.mark.slow
def test_the_grid_is_the_product_of_the_axes_in_order(isolated):
    assert dry_run("model=nano,micro", "tying=tied,untied", "seed=0", "train.lr=1e-3") == [
        ["model=nano", "tying=tied", "seed=0", "train.lr=1e-3"],
        ["model=nano", "tying=untied", "seed=0", "train.lr=1e-3"],
        ["model=micro", "tying=tied", "seed=0", "train.lr=1e-3"],
        ["model=micro", "tying=untied", "seed=0", "train.lr=1e-3"],
    ]
    assert dry_run("seed=range(0,3)") == [["seed=0"], ["seed=1"], ["seed=2"]]
    modes = ["hybrid", "partial", "scaled", "tied", "tied_bias", "tied_then_untied", "untied"]
    assert dry_run("tying=glob(*,exclude=untied_init)") == [[f"tying={m}"] for m in modes]
    Path("mine/tying").mkdir(parents=True)
    Path("mine/tying/half.yaml").write_text("mode: partial\nshared_fraction: 0.5\n")
    assert dry_run("tying=glob(h*)", "--config-dir", "mine") == [["tying=half"], ["tying=hybrid"]]
    assert not Path("runs").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_studies_and_overrides_on_top(isolated):
    result = tiecli("sweep", "study=tying_vs_size", "--dry-run", "--no-estimate")
    assert result.exit_code == 0 and result.stdout.startswith(
        "sweep 'tying_vs_size': 18 job(s), model (3) x tying (2) x seed (3)"
    )
    assert "runs/sweeps/tying_vs_size/nano-untied-bpe4096-shakespeare-s0" in result.output
    jobs = dry_run("study=tying_vs_size", "model=micro", "seed=5")  # the model axis and the seeds replaced
    assert [j[:3] for j in jobs] == [["model=micro", "tying=untied", "seed=5"], ["model=micro", "tying=tied", "seed=5"]]
    assert all(any(o.startswith("train.max_tokens=") for o in j) for j in jobs)
    modes = {o for j in dry_run("study=tying_modes") for o in j if o.startswith("tying=")}
    assert modes == {
        f"tying={m}" for m in ("untied", "tied", "tied_bias", "scaled", "partial", "hybrid", "untied_init")
    }
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/quick.yaml").write_text(
        "# tiecli sweep study=quick --config-dir mine\naxes:\n  seed: range(0,2)\nfixed:\n  model: nano\n"
    )
    assert dry_run("study=quick", "--config-dir", "mine") == [["seed=0", "model=nano"], ["seed=1", "model=nano"]]
    assert not Path("runs").exists()


WHEN_STUDY = """# tiecli sweep study=lrs --config-dir mine
axes:
  model: [nano, micro]
  tying: [untied, tied]
fixed:
  seed: 0
when:
"""
RULES = """  - match: {tying: tied}
    set: {train.lr: 0.006}
  - match: {tying: untied, model: micro}
    set: {train.lr: 0.001, train.min_lr: 0.0001}
"""


@pytest.mark.slow
def test_when_rules_give_matching_jobs_their_own_settings(isolated):
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/lrs.yaml").write_text(WHEN_STUDY + RULES)
    assert dry_run("study=lrs", "--config-dir", "mine") == [
        ["model=nano", "tying=untied", "seed=0"],
        ["model=nano", "tying=tied", "seed=0", "train.lr=0.006"],
        ["model=micro", "tying=untied", "seed=0", "train.lr=0.001", "train.min_lr=0.0001"],
        ["model=micro", "tying=tied", "seed=0", "train.lr=0.006"],
    ]
    # A value matches as a number too: the command line's 0.001 is the rule's 1e-3 (YAML keeps that as text).
    Path("mine/study/lrs_min.yaml").write_text(
        "axes:\n  train.lr: [1e-3, 3e-3]\nwhen:\n  - {match: {train.lr: 1e-3}, set: {train.min_lr: 0.0001}}\n"
    )
    assert dry_run("study=lrs_min", "train.lr=0.001,0.003", "--config-dir", "mine") == [
        ["train.lr=0.001", "train.min_lr=0.0001"],
        ["train.lr=0.003"],
    ]
    # The command line wins: its train.lr replaces every rule's, the rules' other settings stay.
    jobs = dry_run("study=lrs", "train.lr=0.002", "model=micro", "--config-dir", "mine")
    assert jobs == [
        ["model=micro", "tying=untied", "seed=0", "train.lr=0.002", "train.min_lr=0.0001"],
        ["model=micro", "tying=tied", "seed=0", "train.lr=0.002"],
    ]
    bad = {
        "  - match: {seed: 0}\n    set: {train.lr: 1}\n": "when rule 1: matches 'seed', which is not an axis; the axes are model, tying",
        "  - match: {tying: tide}\n    set: {train.lr: 1}\n": "when rule 1: tying=tide is not one of the axis's values: untied, tied",
        "  - match: {tying: tied}\n    set: {seed: 1}\n": "when rule 1: sets 'seed', which the study already sweeps or fixes",
        "  - set: {train.lr: 1}\n": "when rule 1: a rule is {match: {axis: value, ...}, set: {key: value, ...}}",
        RULES
        + "  - match: {model: micro}\n    set: {train.lr: 1}\n": "two when rules set train.lr for the job model=micro tying=untied seed=0",
    }
    for rules, message in bad.items():
        Path("mine/study/lrs.yaml").write_text(WHEN_STUDY + rules)
        one_line_error(tiecli("sweep", "study=lrs", "--config-dir", "mine", "--dry-run"), 2, message)
    assert not Path("runs").exists()


def test_bad_grids_exit_2_and_write_nothing(isolated):
    one_line_error(tiecli("sweep", "seed=0,1", "seed=2"), 2, "'seed' is given twice on the command line")
    shipped = ", ".join(sorted(p.stem for p in (Path(__file__).parent.parent / "conf" / "study").glob("*.yaml")))
    one_line_error(tiecli("sweep", "study=nope"), 2, f"unknown study 'nope'; valid studies: {shipped}")
    one_line_error(tiecli("sweep", *TINY, "train.grad_accum=1,many"), 2, "train.grad_accum='many' has the wrong type")
    one_line_error(tiecli("sweep", "seed=0,0"), 2, "two jobs would share the run directory")
    assert not Path("runs").exists()


@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_others_and_a_rerun_retries_it(isolated):
    Path("good.txt").write_text(TEXT)
    args = ["sweep", *NODATA, "data=textfile", "data.path=good.txt,missing.txt", "--name", "files", "--jobs", "2"]
    result = tiecli(*args)
    assert result.exit_code == 1, result.output
    folder = isolated / "runs" / "sweeps" / "files"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (
        manifest["name"] == "files"
        and manifest["axes"] == {"data.path": ["good.txt", "missing.txt"]}
        and "pid" not in manifest
    )
    assert "data=textfile" in manifest["fixed"] and manifest["command"].startswith("tiecli sweep model=nano")
    good, missing = manifest["jobs"]
    assert good["state"] == "completed" and good["exit_code"] == 0 and good["attempts"] == 1 and good["error"] is None
    assert good["overrides"][-1] == "data.path=good.txt" and good["started"] <= good["ended"]
    assert missing["state"] == "failed" and missing["exit_code"] == 1 and "does not exist" in missing["error"]
    assert json.loads((folder / good["run_dir"] / SUMMARY).read_text())["status"] == "completed"
    assert not (folder / missing["run_dir"]).exists() and "does not exist" in (folder / missing["log"]).read_text()
    assert f"failed: {missing['name']}: error: data.path 'missing.txt' does not exist" in result.output
    assert "1 completed, 1 failed" in result.output

    out = Console(record=True, width=400)
    out.print(status.jobs_table(read_manifest(folder / MANIFEST).jobs, status.Watch(folder)))
    good_row, missing_row = [line for line in out.export_text().splitlines() if "textfile_" in line]
    assert "completed" in good_row and "12/12" in good_row and "failed" in missing_row

    summary = (folder / good["run_dir"] / SUMMARY).read_bytes()
    Path("missing.txt").write_text(TEXT)  # the user fixes the cause and runs the same command again
    result = tiecli(*args)
    assert result.exit_code == 0, result.output
    assert "1 of 2 jobs already completed; skipping them" in result.output
    manifest = json.loads((folder / MANIFEST).read_text())
    assert [(j["state"], j["attempts"]) for j in manifest["jobs"]] == [("completed", 1), ("completed", 2)]
    assert (folder / good["run_dir"] / SUMMARY).read_bytes() == summary

    # the same name with fewer jobs is refused; with more, the new ones join the completed ones
    one_line_error(
        tiecli("sweep", *NODATA, "data=textfile", "data.path=good.txt", "--name", "files"),
        1,
        "already has 1 started job(s) this command leaves out",
    )
    result = tiecli(
        "sweep",
        *NODATA,
        "data=textfile",
        "data.path=good.txt,missing.txt,other.txt",
        "--name",
        "files",
        "--dry-run",
        "--no-estimate",
    )
    actions = [line.split(" [")[1].split("]")[0] for line in result.output.splitlines() if "]: " in line]
    assert actions == ["completed, skip", "completed, skip", "new"]


def test_a_rerun_may_leave_out_jobs_that_never_started_but_not_one_that_did(isolated):
    """A study whose results so far make a planned point needless drops it before it runs; a job that started
    has a run or a log in the folder, so leaving it out is refused."""
    folder, manifest, _ = plan.plan([*TINY, "seed=0,1,2"], None, Path("runs"), "seeds")
    started = manifest.jobs[0]
    started.state, started.attempts, started.exit_code = "completed", 1, 0
    manifests.save(folder, manifest)

    _, fewer, _ = plan.plan([*TINY, "seed=0,1"], None, Path("runs"), "seeds")
    assert [j.name for j in fewer.jobs] == [j.name for j in manifest.jobs[:2]]
    assert (fewer.jobs[0].state, fewer.jobs[0].attempts, fewer.jobs[1].state) == ("completed", 1, "pending")
    out = io.StringIO()
    scheduler._prepare(folder, fewer, Console(file=out, width=300))  # what the sweep says as it starts
    assert f"1 job(s) that never started left out (e.g. {manifest.jobs[2].name!r})" in out.getvalue()
    assert "new job(s)" not in out.getvalue()
    one_line_error(
        tiecli("sweep", *TINY, "seed=1,2", "--name", "seeds", "--dry-run"),
        1,
        f"sweep 'seeds' already has 1 started job(s) this command leaves out (e.g. {started.name!r})",
    )


def test_a_new_axis_with_the_value_the_jobs_ran_extends_the_sweep(isolated):
    """`tiecli sweep ... train.lr=1e-2,3e-3 --name seeds` on a sweep that ran the default lr (3e-3) adds the new
    rate's jobs; the old jobs are the new axis's 3e-3 jobs, names, runs and history kept, at any place in the list."""
    folder, manifest, _ = plan.plan([*TINY, "seed=0,1"], None, Path("runs"), "seeds")
    for job in manifest.jobs:
        job.state, job.attempts, job.exit_code = "completed", 1, 0
    manifests.save(folder, manifest)

    _, wider, configs = plan.plan([*TINY, "seed=0,1", "train.lr=1e-2,3e-3"], None, Path("runs"), "seeds")
    assert len(wider.jobs) == 4 and set(configs) == {j.name for j in wider.jobs}
    kept = [j for j in wider.jobs if j.state == "completed"]
    assert [j.name for j in kept] == [j.name for j in manifest.jobs]  # the same runs, in their folders
    assert all(j.overrides[-1].startswith("train.lr=") and configs[j.name].train.lr == 3e-3 for j in kept)
    added = [j for j in wider.jobs if j.state == "pending"]
    assert [(j.attempts, configs[j.name].train.lr) for j in added] == [(0, 1e-2), (0, 1e-2)]
    assert len(wider.axes["train.lr"]) == 2
    manifests.save(folder, wider)
    assert [
        j.name for j in plan.plan([*TINY, "seed=0,1", "train.lr=1e-2,3e-3"], None, Path("runs"), "seeds")[1].jobs
    ] == [j.name for j in wider.jobs]  # the next re-run of the same command plans the same jobs

    one_line_error(  # values none of the old jobs ran: they would be left out
        tiecli("sweep", *TINY, "seed=0,1", "train.lr=1e-2,2e-2", "--name", "seeds", "--dry-run"),
        1,
        "already has 2 started job(s) this command leaves out",
    )


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_a_rerun_finishes_the_rest(isolated):
    # a short job that completes, a long one to interrupt, and one that is still pending then
    args = [
        "sweep",
        *[o for o in TINY if not o.startswith(("train.max_steps=", "train.checkpoint_interval="))],
        "train.evals=2",  # the long job's time goes to training steps, not to 33 evaluations and checkpoints
        "diag.every=0",
        "train.checkpoint_interval=100",
        "train.max_steps=12,200,13",
        "--name",
        "stop",
    ]
    manifest_path = isolated / "runs" / "sweeps" / "stop" / MANIFEST
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiecli", *args],
        cwd=isolated,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # signal once the second job has taken a few steps
        jobs = json.loads(manifest_path.read_text())["jobs"] if manifest_path.exists() else []
        rows = RunReader(manifest_path.parent / jobs[1]["run_dir"]).metrics() if jobs else []
        if rows and jobs[1]["state"] == "running" and rows[-1].step > 0:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "interrupted; run `tiecli sweep" in out
    first, second, third = json.loads(manifest_path.read_text())["jobs"]
    assert (first["state"], second["state"], third["state"]) == ("completed", "interrupted", "pending")
    assert second["exit_code"] == 130 and third["attempts"] == 0
    stopped = json.loads((manifest_path.parent / second["run_dir"] / SUMMARY).read_text())
    assert stopped["status"] == "interrupted" and 0 < stopped["step"] < 200
    summary = (manifest_path.parent / first["run_dir"] / SUMMARY).read_bytes()

    result = tiecli(*args)
    assert result.exit_code == 0, result.output
    jobs = json.loads(manifest_path.read_text())["jobs"]
    assert [(j["state"], j["attempts"]) for j in jobs] == [("completed", 1), ("completed", 2), ("completed", 1)]
    assert (manifest_path.parent / first["run_dir"] / SUMMARY).read_bytes() == summary
    log = (manifest_path.parent / second["log"]).read_text()
    assert "# attempt 2" in log and "--resume" in log and f"from step {stopped['step']}" in log


def test_without_a_terminal_each_running_job_gets_a_progress_line_at_a_steady_rhythm():
    jobs = [SweepJob(name=f"job{i}", overrides=[], run_dir=f"job{i}", log=f"logs/job{i}.log") for i in range(3)]
    for job in jobs[1:]:
        job.state, job.attempts = "running", 1
    shown = {job.name: {"step": 0, "max_steps": 500, "loss": None, "val_loss": None, "eta": None} for job in jobs}
    clock = [0.0]
    out = io.StringIO()
    plain = status.PlainProgress(
        Console(file=out, width=300),
        SimpleNamespace(progress=lambda job: shown[job.name]),
        jobs,
        every=30,
        clock=lambda: clock[0],
    )

    def tick_at(seconds, **job1):
        clock[0] = seconds
        shown["job1"].update(job1)
        plain.tick(jobs[1:])

    tick_at(0)
    tick_at(10, step=120, loss=4.1234, val_loss=4.5, eta=190.4)  # a step, but 30 s have not passed
    tick_at(30)
    tick_at(45, step=130)
    tick_at(60)
    tick_at(90)  # no new step: no line
    assert out.getvalue().splitlines() == [
        "[2/3] job1: step 120/500 loss 4.123 val 4.5 ETA 3m10s",
        "[2/3] job1: step 130/500 loss 4.123 val 4.5 ETA 3m10s",
    ]


@pytest.mark.slow
def test_a_sweep_in_a_log_file_prints_progress_lines(isolated):
    args = [
        *[o for o in TINY if not o.startswith("train.max_steps=")],
        "train.max_steps=60",
        "seed=0,1",
    ]
    folder, manifest, _ = plan.plan(args, None, Path("runs"), "plain")
    out = io.StringIO()
    assert scheduler.run(folder, manifest, 2, Console(file=out, width=300), every=0) == 0
    pattern = re.compile(r"\[([12])/2\] (\S+): step (\d+)/60 loss \S+ val \S+ ETA \S+")
    lines = [m for m in map(pattern.fullmatch, out.getvalue().splitlines()) if m]
    assert lines, out.getvalue()
    for number in "12":
        mine = [m for m in lines if m[1] == number]
        steps = [int(m[3]) for m in mine]
        assert steps == sorted(set(steps)) and {m[2] for m in mine} <= {manifest.jobs[int(number) - 1].name}


def test_the_eta_counts_down_between_logged_steps(monkeypatch):
    assert status.eta([(10, 100.0), (20, 110.0)], 100, 110.0) == 80  # 1 s a step, 80 steps left
    assert status.eta([(10, 100.0), (20, 110.0)], 100, 115.0) == 75
    assert status.eta([(10, 100.0), (20, 110.0)], 100, 500.0) == 0
    assert status.eta([(10, 100.0)], 100, 110.0) is None and status.eta([(10, 100.0), (10, 105.0)], 100, 110.0) is None

    job = SweepJob(name="job", overrides=[], run_dir="job", log="logs/job.log", state="running", attempts=1)
    files = {"step": 0, "max_steps": 100, "loss": None, "val_loss": None, "start": (0, 0.0), "eta": None}
    monkeypatch.setattr(status, "progress", lambda run_dir: dict(files))
    clock = [0.0]
    watch = status.Watch(Path("runs"), clock=lambda: clock[0])

    def eta_at(seconds, step):
        clock[0], files["step"] = seconds, step
        return watch.progress(job)["eta"]

    assert eta_at(5, 0) is None  # nothing logged yet
    assert eta_at(10, 10) == 90  # from the attempt's start: 1 s a step
    assert [eta_at(12, 10), eta_at(15, 10)] == [88, 85]  # no new line: counting down
    assert eta_at(20, 20) == 80  # from the logged steps seen: (10, 10 s) to (20, 20 s)
    assert eta_at(40, 30) == 105  # slower: 1.5 s a step over (10, 10 s) to (30, 40 s)
    assert eta_at(50, 30) == 95


@pytest.mark.slow
def test_default_names_are_shell_safe_short_and_unique(isolated):
    modes = ["hybrid", "partial", "scaled", "tied", "tied_bias", "tied_then_untied", "untied"]
    cases = [
        ("tying_vs_size", []),
        ("tying_vs_size", [("model", ["micro"])]),
        ("tying_vs_size", [("model", ["tiny"])]),
        ("tying_vs_size", [("seed", ["0", "1", "2", "3"])]),
        (None, []),
        (None, [("model", ["nano", "micro"]), ("seed", ["0", "1", "2"])]),
        (None, [("tying", modes), ("seed", ["0", "1", "2"])]),
        (None, [("tying", modes[:-1]), ("seed", ["0", "1", "2"])]),
        (None, [("seed", ["0", "1"]), ("train.lr", ["1e-3"])]),
        (None, [("seed", ["0", "1"]), ("train.lr", ["3e-3"])]),
        (None, [("data.path", ["a/x.txt", "b/x.txt"])]),
        (None, [("data.path", ["a_x.txt", "b_x.txt"])]),
        (None, [("train.seed", ["0", "1"]), ("seed", ["0", "1"])]),
        (None, [(f"train.key{i}", ["1", "2"]) for i in range(30)]),
    ]
    names = [plan.default_name(study, axes) for study, axes in cases]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,40}", n) for n in names), names
    assert len(set(names)) == len(names), names
    assert [names[0], names[3], names[4], names[5]] == [
        "tying_vs_size",
        "tying_vs_size_seed-0-1-2-3",
        "sweep",
        "model-nano-micro_seed-0-1-2",
    ]
    assert re.fullmatch(r"tying_vs_size-model-[0-9a-f]{8}", names[1])  # a fixed value is not in the name: hashed
    assert re.fullmatch(r"tying-seed-[0-9a-f]{8}", names[6])  # too long to spell out

    result = tiecli("sweep", "tying=glob(*,exclude=untied_init)", "seed=range(0,3)", "--dry-run", "--no-estimate")
    assert result.stdout.startswith(f"sweep '{names[6]}': 21 job(s)"), result.output
    assert tiecli("sweep", "seed=range(0,2)", "--dry-run", "--no-estimate").stdout.startswith(
        "sweep 'seed-0-1': "
    )  # as seed=0,1
    for bad in ("x,seed=(0+1)", "two words", "a/b"):
        one_line_error(tiecli("sweep", "seed=0,1", "--name", bad), 2, f"--name {bad!r} may only hold letters, digits")
    assert not Path("runs").exists()


@pytest.mark.slow
def test_a_dry_run_shows_each_jobs_size_and_the_total(isolated):
    grid = ["tying=tied,untied", "train.evals=4", "train.warmup_fraction=0.25", "diag.max_snapshots=3"]
    result = tiecli("sweep", *TINY, *grid, "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    C, L, T, V = 64, 2, 32, 256  # nano at block_size 32 on byte tokens
    body = L * (12 * C * C + 13 * C) + 2 * C + T * C  # blocks (attention, MLP, LayerNorms), last LayerNorm, positions
    size = dryrun.size_text
    expected, disk = [], 0
    for params, matrices in ((body + V * C, 1), (body + 2 * V * C, 2)):  # tied: one token matrix, untied: two
        checkpoint = params * 4 * 3  # fp32 weights and AdamW's two moments
        snapshots = 3 * matrices * V * C * 4  # 5 geometry steps (0 and 4 evaluations), at most 3 kept
        disk += checkpoint + snapshots
        expected.append(
            f"  12 steps, 1,536 tokens, 4 evaluations, 3 warmup steps; {params:,} parameters; "
            f"disk {size(checkpoint + snapshots)} (checkpoint {size(checkpoint)}, "
            f"3 snapshots {size(snapshots)})"
        )
    lines = result.output.splitlines()
    assert [lines[2], lines[4]] == expected
    assert lines[5] == f"total: 2 job(s), 24 steps, 3,072 tokens, disk {size(disk)}"
    no_snapshots = tiecli(
        "sweep", *TINY, "seed=0,1", "diag.snapshots=false", "--dry-run", "--no-estimate"
    ).output.splitlines()
    assert no_snapshots[2].endswith(f"(checkpoint {size((body + V * C) * 12)}, 0 snapshots 0 B)"), no_snapshots
    assert [size(999), size(1536), size(2**20 - 1), size(3 * 2**40)] == ["999 B", "1.5 KiB", "1.0 MiB", "3.0 TiB"]


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted((default_config_dir() / "study").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_study_expands_and_documents_itself(isolated, path):
    result = tiecli("sweep", f"study={path.stem}", "--dry-run", "--no-estimate")
    assert result.exit_code == 0 and result.output.splitlines()[-1].startswith("total: "), result.output
    lines = path.read_text().splitlines()
    assert lines[0].startswith(f"# tiecli sweep study={path.stem}")
    undocumented = [line for line in lines if re.match(r"\s*[\w.]+:", line) and "#" not in line]
    assert not undocumented, undocumented


MORE_SEEDS = """# tiecli sweep study=primary --config-dir mine
axes:
  model: [nano, micro]
  tying: [untied, tied]
  seed: [0, 1]
fixed:
  data.split_seed: ${seed}
when:
  - {match: {tying: tied}, set: {train.lr: 0.006}}
add:
  - {match: {model: micro}, axes: {seed: [2, 3, 4]}}
families:
  outcome: [C6, R6]
"""


@pytest.mark.slow
def test_a_study_gives_its_primary_comparison_more_seeds_and_declares_families(isolated):
    """`add` repeats the jobs that match (micro, both modes) for seeds 2-4, `when` rules applying to them too;
    `data.split_seed: ${seed}` draws each seed its own held-out split; `families` reaches sweep.json for the report."""
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/primary.yaml").write_text(MORE_SEEDS)
    jobs = dry_run("study=primary", "--config-dir", "mine")
    header = tiecli("sweep", "study=primary", "--config-dir", "mine", "--dry-run", "--no-estimate").output
    assert header.startswith("sweep 'primary': 14 job(s), model (2) x tying (2) x seed (2) + 6 from add rules")
    seeds = {(j[0], j[1]): [o for o in jobs if o[:2] == j[:2]] for j in jobs}
    assert [len(v) for v in seeds.values()] == [2, 2, 5, 5]
    assert ["model=micro", "tying=tied", "seed=4", "data.split_seed=${seed}", "train.lr=0.006"] in jobs
    sweep_dir, manifest, configs = plan.plan(["study=primary"], Path("mine"), Path("runs"), None)
    assert {c.seed: c.data.split_seed for c in configs.values()} == {s: s for s in range(5)}
    assert manifest.study["families"] == {"outcome": ["C6", "R6"]}
    assert manifest.study["add"] == [{"match": {"model": "micro"}, "axes": {"seed": ["2", "3", "4"]}}]
    # the command line's seeds replace the study's, and with them the seeds `add` gives
    assert len(dry_run("study=primary", "seed=7", "--config-dir", "mine")) == 4
    bad = {
        "add:\n  - {match: {model: micro}, axes: {lr: [1]}}\n": "add rule 1: adds values to 'lr', which is not an axis",
        "add:\n  - {match: {size: micro}, axes: {seed: [5]}}\n": "add rule 1: matches 'size', which is not an axis",
        "add:\n  - {axes: {seed: 5}}\n": "add rule 1: a rule is {match: {axis: value, ...}, axes: {axis: [values], ...}}",
        "families:\n  a: [C9]\n": "family 'a' names 'C9', not a judged claim; valid claims: R2, C1,",
        "families:\n  a: [C6]\n  b: [C6]\n": "C6 is in two families, 'a' and 'b'; a claim is in one",
    }
    for text, message in bad.items():
        Path("mine/study/primary.yaml").write_text(MORE_SEEDS.split("add:")[0] + text)
        one_line_error(tiecli("sweep", "study=primary", "--config-dir", "mine", "--dry-run"), 2, message)
    assert not Path("runs").exists()


ADDED_RATE = """# tiecli sweep study=edge --config-dir mine
axes:
  tying: [untied, tied]
  train.lr: [0.001, 0.002]
fixed:
  model: nano
when:
  - {match: {train.lr: 0.001}, set: {train.min_lr: 0.0001}}
  - {match: {train.lr: 0.002}, set: {train.min_lr: 0.0002}}
  - {match: {train.lr: 0.003}, set: {train.min_lr: 0.0003}}
add:
  - {match: {tying: untied}, axes: {train.lr: [0.003]}}
"""


def test_a_when_rule_may_match_a_value_an_add_rule_brings(isolated):
    """A rate added past the grid's edge for one mode gets its own min_lr, as the grid's rates do; a value
    neither the axis nor an add rule has is still refused."""
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/edge.yaml").write_text(ADDED_RATE)
    jobs = dry_run("study=edge", "--config-dir", "mine")
    assert len(jobs) == 5
    assert ["tying=untied", "train.lr=0.003", "model=nano", "train.min_lr=0.0003"] in jobs
    assert not any("tying=tied" in j and "train.lr=0.003" in j for j in jobs)
    Path("mine/study/edge.yaml").write_text(ADDED_RATE.replace("train.lr: 0.003}, set", "train.lr: 0.004}, set"))
    one_line_error(
        tiecli("sweep", "study=edge", "--config-dir", "mine", "--dry-run"),
        2,
        "when rule 3: train.lr=0.004 is not one of the axis's values: 0.001, 0.002, 0.003",
    )


def test_an_add_rule_may_give_seeds_to_a_value_an_earlier_add_rule_brings(isolated):
    """The ladder's order: a third rate for untied first, then more seeds at it once it is the pick. The rules
    apply in order, so the second may match the first's value; a rule that matches a value only a later rule
    brings is refused, as it would match no job."""
    study = ADDED_RATE.replace("0.002]\n", "0.002]\n  seed: [0]\n")
    seeds = "  - {match: {tying: untied, train.lr: 0.003}, axes: {seed: [1, 2]}}\n"
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/edge.yaml").write_text(study + seeds)
    jobs = dry_run("study=edge", "--config-dir", "mine")
    assert len(jobs) == 7
    assert ["tying=untied", "train.lr=0.003", "seed=2", "model=nano", "train.min_lr=0.0003"] in jobs
    first, second = study.rsplit("  - ", 1)
    Path("mine/study/edge.yaml").write_text(first + seeds + "  - " + second)
    one_line_error(
        tiecli("sweep", "study=edge", "--config-dir", "mine", "--dry-run"),
        2,
        "add rule 1: train.lr=0.003 is not one of the axis's values: 0.001, 0.002",
    )
