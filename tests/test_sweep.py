"""`tiecli sweep` driven as a user drives it: dry runs for the grid, real sweeps of tiny jobs for the rest."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from conftest import TINY
from tiecli import rundir, sweep
from tiecli.cli import app

runner = CliRunner()
TEXT = "".join(f"line {i}: the quick brown fox jumps over {i % 7} lazy dogs.\n" for i in range(2000))


def tiecli(*args):
    return runner.invoke(app, [str(a) for a in args])


def dry_run(*args) -> list[list[str]]:
    """Each job's overrides, in the order the dry run lists them."""
    result = tiecli("sweep", *args, "--dry-run")
    assert result.exit_code == 0, result.output
    return [line.split("]: ", 1)[1].split() for line in result.output.splitlines()[1:]]


def one_line_error(result, code, text):
    assert result.exit_code == code, result.output
    assert text in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0, result.output


def test_the_grid_is_the_product_of_the_axes_in_order(isolated):
    assert dry_run("model=nano,micro", "tying=tied,untied", "seed=0", "train.lr=1e-3") == [
        ["model=nano", "tying=tied", "seed=0", "train.lr=1e-3"],
        ["model=nano", "tying=untied", "seed=0", "train.lr=1e-3"],
        ["model=micro", "tying=tied", "seed=0", "train.lr=1e-3"],
        ["model=micro", "tying=untied", "seed=0", "train.lr=1e-3"],
    ]
    assert dry_run("seed=range(0,3)") == [["seed=0"], ["seed=1"], ["seed=2"]]
    modes = ["hybrid", "partial", "scaled", "tied", "tied_bias", "untied"]
    assert dry_run("tying=glob(*,exclude=untied_init)") == [[f"tying={m}"] for m in modes]
    Path("mine/tying").mkdir(parents=True)
    Path("mine/tying/half.yaml").write_text("mode: partial\nshared_fraction: 0.5\n")
    assert dry_run("tying=glob(h*)", "--config-dir", "mine") == [["tying=half"], ["tying=hybrid"]]
    assert not Path("runs").exists()  # a dry run writes nothing


def test_studies_and_overrides_on_top(isolated):
    result = tiecli("sweep", "study=tying_vs_size", "--dry-run")
    assert result.exit_code == 0 and result.output.startswith("sweep 'tying_vs_size': 18 job(s), model (3) x tying (2) x seed (3)")
    assert "runs/sweeps/tying_vs_size/nano-untied-bpe4096-shakespeare-s0," in result.output
    jobs = dry_run("study=tying_vs_size", "model=micro", "seed=5")  # the model axis and the seeds replaced
    assert [j[:3] for j in jobs] == [["model=micro", "tying=untied", "seed=5"], ["model=micro", "tying=tied", "seed=5"]]
    assert all(any(o.startswith("train.max_tokens=") for o in j) for j in jobs)
    modes = {o for j in dry_run("study=tying_modes") for o in j if o.startswith("tying=")}
    assert modes == {f"tying={m}" for m in ("untied", "tied", "tied_bias", "scaled", "partial", "hybrid", "untied_init")}
    Path("mine/study").mkdir(parents=True)
    Path("mine/study/quick.yaml").write_text("# tiecli sweep study=quick --config-dir mine\naxes:\n  seed: range(0,2)\nfixed:\n  model: nano\n")
    assert dry_run("study=quick", "--config-dir", "mine") == [["seed=0", "model=nano"], ["seed=1", "model=nano"]]
    assert not Path("runs").exists()


def test_bad_grids_exit_2_and_write_nothing(isolated):
    one_line_error(tiecli("sweep", "seed=0,1", "seed=2"), 2, "'seed' is given twice on the command line")
    one_line_error(tiecli("sweep", "study=nope"), 2, "unknown study 'nope'; valid studies: tying_modes, tying_vs_size")
    one_line_error(tiecli("sweep", *TINY, "train.grad_accum=1,many"), 2, "train.grad_accum='many' has the wrong type")
    one_line_error(tiecli("sweep", "seed=0,0"), 2, "two jobs would share the run directory")
    assert not Path("runs").exists()


def test_a_failing_job_does_not_stop_the_others_and_a_rerun_retries_it(isolated):
    Path("good.txt").write_text(TEXT)
    args = ["sweep", *TINY, "data=textfile", "data.path=good.txt,missing.txt", "--name", "files", "--jobs", "2"]
    result = tiecli(*args)
    assert result.exit_code == 1, result.output
    folder = isolated / "runs" / "sweeps" / "files"
    manifest = json.loads((folder / sweep.MANIFEST).read_text())
    assert manifest["name"] == "files" and manifest["axes"] == {"data.path": ["good.txt", "missing.txt"]} and "pid" not in manifest
    assert "data=textfile" in manifest["fixed"] and manifest["command"].startswith("tiecli sweep model=nano")
    good, missing = manifest["jobs"]
    assert good["state"] == "completed" and good["exit_code"] == 0 and good["attempts"] == 1 and good["error"] is None
    assert good["overrides"][-1] == "data.path=good.txt" and good["started"] <= good["ended"]
    assert missing["state"] == "failed" and missing["exit_code"] == 1 and "does not exist" in missing["error"]
    assert json.loads((folder / good["run_dir"] / rundir.SUMMARY).read_text())["status"] == "completed"
    assert not (folder / missing["run_dir"]).exists() and "does not exist" in (folder / missing["log"]).read_text()
    assert f"failed: {missing['name']}: error: data.path 'missing.txt' does not exist" in result.output
    assert "1 completed, 1 failed" in result.output

    out = Console(record=True, width=400)
    out.print(sweep.jobs_table(rundir.read_manifest(folder / sweep.MANIFEST).jobs, folder, {}))
    good_row, missing_row = [line for line in out.export_text().splitlines() if "textfile_" in line]
    assert "completed" in good_row and "12/12" in good_row and "failed" in missing_row

    summary = (folder / good["run_dir"] / rundir.SUMMARY).read_bytes()
    Path("missing.txt").write_text(TEXT)  # the user fixes the cause and runs the same command again
    result = tiecli(*args)
    assert result.exit_code == 0, result.output
    assert "1 of 2 jobs already completed; skipping them" in result.output
    manifest = json.loads((folder / sweep.MANIFEST).read_text())
    assert [(j["state"], j["attempts"]) for j in manifest["jobs"]] == [("completed", 1), ("completed", 2)]
    assert (folder / good["run_dir"] / rundir.SUMMARY).read_bytes() == summary

    # the same name with fewer jobs is refused; with more, the new ones join the completed ones
    one_line_error(tiecli("sweep", *TINY, "data=textfile", "data.path=good.txt", "--name", "files"), 1, "already has 1 job(s) this command leaves out")
    result = tiecli("sweep", *TINY, "data=textfile", "data.path=good.txt,missing.txt,other.txt", "--name", "files", "--dry-run")
    assert [line.split(" [")[1].split("]")[0] for line in result.output.splitlines()[1:]] == ["completed, skip", "completed, skip", "new"]


def test_ctrl_c_stops_cleanly_and_a_rerun_finishes_the_rest(isolated):
    # a short job that completes, a long one to interrupt, and one that is still pending then
    args = ["sweep", *[o for o in TINY if not o.startswith("train.max_steps=")], "train.max_steps=12,200,13", "--name", "stop"]
    manifest_path = isolated / "runs" / "sweeps" / "stop" / sweep.MANIFEST
    proc = subprocess.Popen([sys.executable, "-m", "tiecli", *args], cwd=isolated, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # signal once the second job has taken a few steps
        jobs = json.loads(manifest_path.read_text())["jobs"] if manifest_path.exists() else []
        rows = rundir.RunReader(manifest_path.parent / jobs[1]["run_dir"]).metrics() if jobs else []
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
    stopped = json.loads((manifest_path.parent / second["run_dir"] / rundir.SUMMARY).read_text())
    assert stopped["status"] == "interrupted" and 0 < stopped["step"] < 200
    summary = (manifest_path.parent / first["run_dir"] / rundir.SUMMARY).read_bytes()

    result = tiecli(*args)
    assert result.exit_code == 0, result.output
    jobs = json.loads(manifest_path.read_text())["jobs"]
    assert [(j["state"], j["attempts"]) for j in jobs] == [("completed", 1), ("completed", 2), ("completed", 1)]
    assert (manifest_path.parent / first["run_dir"] / rundir.SUMMARY).read_bytes() == summary
    log = (manifest_path.parent / second["log"]).read_text()
    assert "# attempt 2" in log and "--resume" in log and f"from step {stopped['step']}" in log
