# Used by tiecli/cli.py: the options and arguments several commands share, or whose help is long.
"""Typer option and argument types, named so that each command's signature reads as a list of settings."""

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from tiecli.errors import ConfigError

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides: GROUP=CHOICE or KEY=VALUE, e.g. tying=untied train.lr=1e-3", show_default=False
    ),
]


ConfigDir = Annotated[
    Path | None,
    typer.Option(
        "--config-dir",
        help="A folder of your own config files: they add to tiecli's conf/ (e.g. model/huge.yaml) and replace its files of the same name",
    ),
]


# `tiecli train`'s and `tiecli geometry`'s longer options.
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue a run from its last checkpoint with its own config: "
        "`--resume RUN_DIR`, or `--name NAME --resume`; overrides may extend it (train.max_steps=...)",
    ),
]


Nproc = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        help="Train data-parallel on N processes of this machine: starts torchrun --nproc_per_node N "
        "(one GPU each on CUDA, gloo on CPU); the global batch stays train.batch_size x train.grad_accum",
    ),
]


WriteEntry = Annotated[
    bool,
    typer.Option("--write", help="Also record the entry in the run's geometry.json (replacing one for the same step)"),
]


# `tiecli sweep`'s options, named here so the command reads as its list of settings.
LauncherName = Annotated[
    str,
    typer.Option(
        "--launcher",
        help="basic (subprocesses here), submitit_local (submitit, here) or submitit_slurm (one SLURM job array); "
        "settings: conf/launcher/NAME.yaml, changed with launcher.KEY=VALUE",
    ),
]


GpusPerJob = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-job",
        min=1,
        help="GPUs per job (CUDA_VISIBLE_DEVICES, round-robin); more than 1 runs the job under torchrun",
        show_default=False,
    ),
]


StatusOf = Annotated[
    str | None,
    typer.Option(
        "--status", metavar="NAME", help="Show sweep NAME's jobs (state, job id, step, losses); submit nothing"
    ),
]


DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the jobs, their run directories, steps, tokens, evaluations, disk use and the "
        "wall time estimated from a few steps measured here, and the total; run and write nothing",
    ),
]


Estimate = Annotated[
    bool, typer.Option("--estimate/--no-estimate", help="With --dry-run: time a few steps per model size here")
]


RunsDir = Annotated[
    Path, typer.Option("--runs-dir", help="Folder where a bare run NAME is looked up (RUN may also be a path)")
]


Multirun = Annotated[bool, typer.Option("-m", "--multirun", hidden=True, help="Hydra's multirun: tiecli sweep does it")]


# tiecli report's options, named here so that its signature reads as a list
Select = Annotated[
    list[str] | None,
    typer.Option(
        "--select",
        help="A dotted key (train.lr) whose best value, by seed-mean final val loss, "
        "is kept per group; the others are listed as not selected. Repeatable",
    ),
]


Sesoi = Annotated[
    list[str] | None,
    typer.Option(
        "--sesoi",
        help="Smallest effect of interest, KEY=VALUE: ppl (% perplexity, default 1), "
        "cos (default 0.05), cka (default 0.05), drift and gnorm (% of a tied/untied ratio, default 10), "
        "spikes (loss spikes per run, default 1). Repeatable",
    ),
]


TargetLoss = Annotated[
    float | None,
    typer.Option(
        "--target-loss",
        help="A fixed convergence target (val loss, nats) for every "
        "pair (default: per pair, the higher of the two groups' best losses)",
    ),
]


Family = Annotated[
    list[str] | None,
    typer.Option(
        "--family",
        help="A Holm family, NAME=CLAIM[,CLAIM...], replacing the families the sweeps declared "
        "(default: one per claim). Repeatable",
    ),
]


ReportRunsDir = Annotated[
    Path, typer.Option("--runs-dir", help="Folder where a bare name (a run, sweeps/NAME) is looked up")
]


class Split(str, Enum):
    val = "val"
    test = "test"
    train = "train"


class ExportTarget(str, Enum):
    hf = "hf"
    safetensors = "safetensors"


# Each command's own options and arguments, named <Command><Option>.
TrainName = Annotated[
    str | None,
    typer.Option(
        help="Run directory name: letters, digits, . _ - and / to nest it in a folder "
        "(default: the group choices, the seed and a hash of any other overrides)"
    ),
]
EvalSplit = Annotated[
    Split,
    typer.Option(
        help="Split to evaluate: val or test in full; train in full when it is at most "
        "4 times the validation split, else a fixed evenly spaced subset of that size"
    ),
]
EvalStep = Annotated[
    str,
    typer.Option(
        help="latest (last.pt; recorded in eval.json), or a step with a full checkpoint "
        "(train.keep_checkpoints keeps them): printed only"
    ),
]
GeometryRun = Annotated[
    Path | None, typer.Argument(help="A run directory (or --model PATH instead)", show_default=False)
]
GeometryModel = Annotated[
    str | None,  # a str, not a Path: Path("") would read as "." and hide an empty value
    typer.Option(
        "--model",
        help="A pretrained model instead of a run: a .gguf file or a Hugging Face folder with config.json and "
        "*.safetensors; only its token matrices and vocabulary are read",
    ),
]
GeometryStep = Annotated[
    str,
    typer.Option(help="latest (the last checkpoint), init (step 0), or a step with a snapshot in checkpoints/emb/"),
]
GeometryPairs = Annotated[
    Path | None,
    typer.Option(
        help="Related word forms: a UTF-8 file, one tab-separated pair a line "
        "(default: the run's diag.pairs; with --model, the shipped en)"
    ),
]
GeometryOut = Annotated[
    Path | None,
    typer.Option(
        help="With --model: write DIR/pretrained.json, which `tiecli report DIR ...` shows as a reference row"
    ),
]
ExportOutDir = Annotated[
    Path, typer.Argument(help="Folder to write (created; refused if it holds files, unless --force)")
]
ExportTo = Annotated[
    ExportTarget,
    typer.Option(
        help="hf: a transformers GPT2LMHeadModel folder with tokenizer.json; "
        "safetensors: tiecli's own state dict with the run's config as metadata"
    ),
]
SampleTemperature = Annotated[
    float, typer.Option(help="Divide the logits by this; 0 always takes the most likely token")
]
SampleTopP = Annotated[
    float, typer.Option(help="Sample among the fewest most likely tokens that reach this probability (1: all)")
]
SampleAsJson = Annotated[
    bool, typer.Option("--json", help="Print JSON with the token ids and each token's log-probability")
]
SampleCompare = Annotated[
    Path | None, typer.Option(help="A second run, sampled with the same prompt and seed, printed side by side")
]
SweepName = Annotated[
    str | None,
    typer.Option(
        help="Sweep name, letters, digits and . _ - only: its folder is <runs-dir>/sweeps/<name> "
        "(default: the study name, or built from the overrides)"
    ),
]
SweepJobs = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        min=1,
        help="Jobs to run at once on this machine (basic, submitit_local; default 1)",
        show_default=False,
    ),
]
ReportPaths = Annotated[
    list[Path] | None,
    typer.Argument(
        help="Run directories, sweep folders or any folders holding runs (default: runs/)", show_default=False
    ),
]
ReportBaseline = Annotated[
    str, typer.Option(help="KEY=VALUE picking the baseline among groups equal in every other key")
]
ReportOut = Annotated[
    Path | None, typer.Option(help="Output folder (default: report/ inside the one sweep given, else ./report)")
]


def check_step_option(step: str) -> None:
    """--step: latest or a whole number of steps (a usage error otherwise, exit 2)."""
    if step != "latest" and not step.isdigit():
        raise ConfigError(f"--step {step!r} must be latest or a step number (e.g. --step 500)")
