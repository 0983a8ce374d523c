import dataclasses
import re

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from tiecli.config import naming, readers
from tiecli.config.checks import to_config
from tiecli.config.compose import check_unique, compose, default_config_dir, parse_overrides
from tiecli.config.schema import (
    GROUPS,
    LIST_GROUPS,
    Composed,
    Config,
    DataConfig,
    DiagConfig,
    EvalConfig,
    GPTConfig,
    LocalLauncher,
    ModelShape,
    Settings,
    TokenizerConfig,
    TrainConfig,
)
from tiecli.errors import ConfigError, TiecliError


def test_defaults_compose_to_dataclasses():
    cfg, choices = compose([])
    assert choices == {"model": "micro", "tying": "tied", "data": "shakespeare", "tokenizer": "bpe"}
    c = to_config(cfg)
    assert (c.model.n_layer, c.model.n_embd, c.model.vocab_size, c.model.tying) == (4, 128, 4096, "tied")
    assert c.max_steps == c.train.max_steps
    assert isinstance(c.train.lr, float)


def test_overrides_reach_the_dataclasses():
    cfg, choices = compose(
        ["tying=partial", "tying.shared_fraction=0.25", "model=gpt2", "tokenizer=gpt2", "train.lr=1e-3", "seed=7"]
    )
    c = to_config(cfg)
    assert choices["tying"] == "partial" and c.model.shared_fraction == 0.25
    assert (c.model.block_size, c.model.vocab_size, c.train.lr, c.seed) == (1024, 50257, 1e-3, 7)


def test_token_budget_sets_steps():
    c = to_config(compose(["train.max_tokens=100000", "train.batch_size=8"])[0])
    assert c.tokens_per_step == 8 * 128
    assert c.max_steps == 98  # ceil(100000 / 1024)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            ["tying=glued"],
            "unknown tying 'glued'; valid choices: hybrid, partial, scaled, tied, tied_bias, tied_then_untied, untied, untied_init",
        ),
        (["model=huge"], "unknown model 'huge'; valid choices: gpt2, medium, micro, nano, small, tiny"),
        (["train.lrr=1"], "unknown config key 'train.lrr'; valid keys under 'train': batch_size"),
        (["tying=untied", "tying.rank=4"], "tying.rank is read by tying=hybrid only, not by tying=untied"),
        (["sede=1"], "unknown config key 'sede'; valid keys at the top level"),
        (["model=nano,micro"], "is a sweep"),
        (["seed=range(0,3)"], "is a sweep"),
        (["+train.foo=1"], "adds or deletes a key"),
        (["train.lr=[oops"], "cannot parse overrides"),
    ],
)
def test_bad_overrides_name_the_valid_choices(override, message):
    with pytest.raises(ConfigError) as e:
        to_config(compose(override)[0])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override, message",
    [
        (["train.max_steps=abc"], "train.max_steps='abc' has the wrong type; expected int"),
        (["train.max_steps=0"], "train.max_steps=0 must be at least 1"),
        (["device=tpu"], "device='tpu' is not valid"),
        (["dtype=fp8"], "dtype='fp8' is not valid; choose one of auto, fp32, bf16"),
        (["data=textfile"], "data.path is required"),
        (["tokenizer=bytes", "tokenizer.vocab_size=300"], "bytes has exactly 256 tokens"),
        (["tokenizer.vocab_size=100"], "bpe needs more than 256"),
        (["model.n_head=5"], "not divisible by n_head=5"),
        (["model.dropout=2"], "dropout=2.0 is not in [0, 1)"),
        (["model.block_size=0"], "block_size=0 must be at least 1"),
        (["model.n_layer=0"], "n_layer=0 must be at least 1"),
        (["eval.buckets=[a,b]"], "eval.buckets[0]='a' has the wrong type; expected float"),
        (["eval.buckets=[0.5]"], "eval.buckets=[0.5] must be two increasing fractions"),
        (["train=5"], "train=5 must be a group of keys"),
        (["seed=abc"], "seed='abc' has the wrong type; expected int"),
    ],
)
def test_bad_values_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        to_config(compose(override)[0])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_the_dataclasses_have_no_defaults_conf_has_them():
    for cls in (
        TrainConfig,
        DataConfig,
        TokenizerConfig,
        EvalConfig,
        DiagConfig,
        Settings,
        ModelShape,
        Composed,
        Config,
    ):
        fields = dataclasses.fields(cls)
        assert [f.name for f in fields if (f.default, f.default_factory) != (dataclasses.MISSING,) * 2] == [], (
            cls.__name__
        )
    sizes = {"vocab_size", "block_size", "n_layer", "n_head", "n_embd"}
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(GPTConfig) if f.name in sizes)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        (["train.lr=inf"], "train.lr=inf must be finite (not inf or nan)"),
        (["train.weight_decay=inf"], "train.weight_decay=inf must be finite"),
        (["train.grad_clip=nan"], "train.grad_clip=nan must be finite"),
        (["train.min_lr=-inf"], "train.min_lr=-inf must be finite"),
        (["model.dropout=nan"], "model.dropout=nan must be finite"),
        (["tying=partial", "tying.shared_fraction=nan"], "tying.shared_fraction=nan must be finite"),
        (["eval.buckets=[0.5,inf]"], "eval.buckets=[0.5, inf] must be finite"),
        (["train.beta1=2"], "train.beta1=2.0 is not in [0, 1)"),
        (["train.beta1=1"], "train.beta1=1.0 is not in [0, 1)"),
        (["train.beta2=-1"], "train.beta2=-1.0 is not in [0, 1)"),
        (
            ["seed=99999999999999999999999"],
            "seed=99999999999999999999999 is not valid; a seed is an integer in [0, 2**63)",
        ),
        (["seed=-1"], "seed=-1 is not valid; a seed is an integer in [0, 2**63)"),
        (["diag.seed=-1"], "diag.seed=-1 is not valid"),
        (["seed=1.5"], "seed=1.5 has the wrong type; expected int"),
        (["train.lr=${oops}"], "train.lr='${oops}' cannot be resolved: Interpolation key 'oops' not found"),
        (["train.lr=${data.name}"], "train.lr='${data.name}' (= 'shakespeare') has the wrong type; expected float"),
        (["train.max_tokens=abc"], "train.max_tokens='abc' has the wrong type; expected int or null"),
        (["eval.buckets=5"], "eval.buckets=5 has the wrong type; expected a list of float"),
        (
            ["model=nano", "model=micro"],
            "'model' is given twice on the command line ('model=nano' and 'model=micro'); give it once",
        ),
        (["train.lr=1", "train.lr=2"], "'train.lr' is given twice on the command line ('train.lr=1' and 'train.lr=2')"),
        (["model.n_head=0"], "n_head=0 must be at least 1"),
        (
            ["trainn.lr=1"],
            "unknown config key 'trainn'; valid keys at the top level: compile, data, device, diag, dtype, eval, logger, model,",
        ),
        (["seed.value=1"], "unknown config key 'seed.value': 'seed' is a single value, not a group of keys"),
    ],
)
def test_new_checks_refuse_in_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        to_config(compose(override)[0])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_compose_refuses_an_interpolation_that_cannot_resolve():
    with pytest.raises(
        ConfigError, match=r"^seed='\$\{oops\}' cannot be resolved: Interpolation key 'oops' not found$"
    ):
        compose(["seed=${oops}"])  # before run_name and to_yaml, which resolve it


def test_interpolations_that_resolve_are_fine():
    c = to_config(compose(["train.min_lr=${train.lr}", "train.lr=1e-3"])[0])
    assert c.train.min_lr == c.train.lr == 1e-3


def test_a_tied_model_narrower_than_the_hybrid_rank_is_fine():
    c = to_config(compose(["model.n_embd=8", "model.n_head=2"])[0])
    assert (c.model.n_embd, c.model.tying) == (8, "tied")
    with pytest.raises(ConfigError, match=r"rank=16 is not in \[1, n_embd=8\]"):
        to_config(compose(["model.n_embd=8", "model.n_head=2", "tying=hybrid"])[0])


def test_a_stored_config_is_checked_against_the_schema_too():
    cfg = compose([])[0]
    OmegaConf.set_struct(cfg, False)  # as a config.yaml read back from a run directory
    for key, message in [
        ("train.foo", "unknown config key 'train.foo'; valid keys under 'train': batch_size, beta1"),
        ("foo", "unknown config key 'foo'; valid keys at the top level: compile, data"),
    ]:
        bad = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}=1"]))
        with pytest.raises(ConfigError, match=message):
            to_config(bad)
    del cfg.train["lr"]
    with pytest.raises(ConfigError, match="train.lr is required"):
        to_config(cfg)


def test_check_unique_names_both_overrides():
    check_unique(parse_overrides(["model=nano", "model.n_layer=3"]), "here")
    with pytest.raises(ConfigError, match=r"'seed' is given twice in study 'x' \('seed=1' and 'seed=2'\)"):
        check_unique(parse_overrides(["seed=1", "seed=2"]), "in study 'x'")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "info"])
@pytest.mark.parametrize(
    "override",
    [
        "train.lr=inf",
        "train.beta1=2",
        "seed=-1",
        "train.lr=${oops}",
        "model=nano model=micro",
        "train.evals=0",
        "train.warmup_fraction=2",
        "diag.max_snapshots=0",
    ],
)
def test_the_cli_exits_2_with_one_line_and_no_run(isolated, command, override):
    # Imported here, so the rest of this file does not depend on the CLI module.
    from tiecli.cli import app

    result = CliRunner().invoke(app, [command, *override.split()])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.strip().count("\n") == 0, result.output
    assert not (isolated / "runs").exists()


def run_name(*overrides, config_dir=None):
    cfg, choices = compose(list(overrides), config_dir)
    return naming.run_name(choices, cfg, list(overrides))


@pytest.mark.slow
def test_run_name_is_readable_short_and_shell_safe():
    assert run_name() == "micro-tied-bpe4096-shakespeare-s0"
    assert run_name("tying=untied", "seed=2", "tokenizer.vocab_size=8192") == "micro-untied-bpe8192-shakespeare-s2"
    lr = run_name("train.lr=1e-3")
    assert re.fullmatch(r"micro-tied-bpe4096-shakespeare-s0-[0-9a-f]{8}", lr)
    assert run_name("data=textfile", "data.path=/some/where/notes.txt") == "micro-tied-bpe4096-textfile_notes-5fc726-s0"
    assert run_name("data=textfile", "data.path=/else/where/notes.txt") != run_name(
        "data=textfile", "data.path=/some/where/notes.txt"
    )
    # The names: commas, =, +, parentheses, * and 120 characters.
    many = [
        f"train.{k}=1"
        for k in (
            "eval_interval",
            "log_interval",
            "checkpoint_interval",
            "eval_batches",
            "grad_accum",
            "beta1",
            "beta2",
            "warmup_steps",
        )
    ]
    odd = [
        "train.max_tokens=524288",
        "train.lr=3e-3",
        "data=textfile",
        "data.path='/data/my corpus (v2)+*.txt'",
        "tying=partial",
        "tying.shared_fraction=0.25",
        "model.dropout=0.1",
        *many,
    ]
    names = {
        run_name(*odd),
        run_name(*odd[:-1]),
        run_name(*odd[:-2]),
        run_name(*(o for o in odd if o != "model.dropout=0.1"), "model.dropout=0.2"),
        lr,
        run_name("train.lr=2e-3"),
        run_name("train.lr=1e-3", "train.min_lr=1e-4"),
        run_name("train.min_lr=1e-4", "train.lr=1e-3"),
    }
    assert len(names) == 7  # different overrides, different names; the order they are given in does not matter
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name) and len(name) <= 80, name
    assert run_name(*odd).startswith("micro-partial-bpe4096-textfile_my_corpus__v2___-")


@pytest.mark.slow
def test_long_choice_names_are_cut_and_kept_apart(tmp_path):
    (tmp_path / "model").mkdir()
    for long in ("a" * 70 + "+one", "a" * 70 + "+two"):
        (tmp_path / "model" / f"{long}.yaml").write_text("n_layer: 1\nn_head: 1\nn_embd: 8\n")
    one, two = (run_name(f"model={'a' * 70}+{n}", config_dir=tmp_path) for n in ("one", "two"))
    assert one != two and len(one) == len(two) == 80 and re.fullmatch(r"[A-Za-z0-9._-]+", one)


def test_check_name_allows_nesting_and_names_the_allowed_characters():
    naming.check_name("ablation/micro-tied_v1.2")
    with pytest.raises(TiecliError, match=r"^run name 'a,b=c' holds ',=';.* A-Z a-z 0-9 \. _ - \(and / to nest"):
        naming.check_name("a,b=c")


def conf(*overrides):
    return to_config(compose(list(overrides))[0])


def eval_steps(c):
    return [step for step in range(1, c.max_steps + 1) if c.is_eval_step(step)]


@pytest.mark.slow
@pytest.mark.parametrize("steps", [100, 100_000])
def test_intervals_scale_with_the_run(steps):
    default = conf(f"train.max_steps={steps}")  # the defaults scale: 5 evaluations, a tenth warming up
    assert (default.eval_every, default.n_evals, default.warmup) == (steps // 5, 5, steps // 10)
    fixed = conf(
        f"train.max_steps={steps}", "train.eval_interval=100", "train.warmup_steps=50"
    )  # given alone: they win
    assert (fixed.eval_every, fixed.n_evals, fixed.warmup) == (100, steps // 100, 50)
    scaled = conf(f"train.max_steps={steps}", "train.evals=20", "train.warmup_fraction=0.05")
    assert (scaled.eval_every, scaled.n_evals, scaled.warmup) == (steps // 20, 20, steps // 20)
    assert eval_steps(scaled) == [steps // 20 * i for i in range(1, 21)]
    odd = conf(f"train.max_steps={steps}", "train.evals=30", "train.warmup_fraction=0.333")
    at = eval_steps(odd)
    assert odd.n_evals == len(at) == 30 and at[-1] == steps and odd.warmup == round(0.333 * steps)
    gaps = {b - a for a, b in zip([0, *at], at)}
    assert max(gaps) - min(gaps) <= 1 and odd.eval_every == round(steps / 30)  # evenly spread


@pytest.mark.slow
def test_intervals_with_a_token_budget_and_more_evaluations_than_steps():
    c = conf("train.max_tokens=100000", "train.batch_size=8", "train.evals=4", "train.warmup_fraction=0.1")
    assert c.max_steps == 98 and c.n_evals == 4 and eval_steps(c) == [25, 49, 74, 98] and c.warmup == 10
    every_step = conf("train.max_steps=5", "train.evals=50")
    assert every_step.n_evals == 5 and eval_steps(every_step) == [1, 2, 3, 4, 5] and every_step.eval_every == 1
    tail = conf("train.max_steps=250", "train.eval_interval=100")  # 100, 200 and the end
    assert eval_steps(tail) == [100, 200, 250] and tail.n_evals == 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        ("train.evals=0", "train.evals=0 must be at least 1 (or null: every train.eval_interval steps)"),
        ("train.warmup_fraction=1.0", "train.warmup_fraction=1.0 is not in [0, 1) (or null: train.warmup_steps)"),
        ("train.warmup_fraction=-0.1", "train.warmup_fraction=-0.1 is not in [0, 1)"),
        ("train.lr_embedding=0", "train.lr_embedding=0.0 must be > 0 (or null: train.lr)"),
        ("train.lr_output=-1e-3", "train.lr_output=-0.001 must be > 0"),
        ("train.lr_output=inf", "train.lr_output=inf must be finite"),
        ("diag.max_snapshots=1", "diag.max_snapshots=1 must be at least 2"),
        ("eval.test=maybe", "eval.test='maybe' has the wrong type; expected bool"),
    ],
)
def test_new_keys_are_checked(override, message):
    with pytest.raises(ConfigError) as e:
        conf(override)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_config_dir_adds_choices_and_wins(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "huge.yaml").write_text("n_layer: 24\nn_head: 16\nn_embd: 1024\n")
    cfg, choices = compose(["model=huge"], config_dir=tmp_path)
    assert choices["model"] == "huge" and cfg.model.n_layer == 24 and cfg.model.block_size == 128
    (tmp_path / "model" / "micro.yaml").write_text(
        "n_layer: 7\nn_head: 4\nn_embd: 128\n"
    )  # same name as tiecli's: the user's wins
    assert compose([], config_dir=tmp_path)[0].model.n_layer == 7
    assert compose([])[0].model.n_layer == 4
    with pytest.raises(ConfigError, match="valid choices: gpt2, huge, medium"):
        compose(["model=giant"], config_dir=tmp_path)
    with pytest.raises(ConfigError, match="is not a folder"):
        compose([], config_dir=tmp_path / "missing")


def test_packaged_conf_is_found():
    assert (default_config_dir() / "config.yaml").is_file()


def test_resume_may_change_what_measures_a_run_not_what_trains_it():
    from tiecli.config.compose import resume_config

    stored, choices = compose([])
    cfg = resume_config(stored, choices, ["train.evals=10", "eval.test=false", "diag.max_snapshots=5"])
    assert (cfg.train.evals, cfg.eval.test, cfg.diag.max_snapshots) == (10, False, 5)
    for override in ("train.warmup_fraction=0.2", "train.lr_embedding=0.01", "train.lr_output=0.01"):
        with pytest.raises(ConfigError) as e:
            resume_config(stored, choices, [override])
        assert re.match(f"{override.split('=')[0]} was (None|0.1) in this run", str(e.value))
        assert str(e.value).endswith(
            "train.evals, train.eval_batches, train.log_interval, train.checkpoint_interval, "
            "train.checkpoints, eval.test and diag.* keys (start a new run with another --name)"
        )  # no logger.*: no such key


def test_check_name_for_a_sweep_refuses_nesting_with_its_own_words():
    naming.check_name("micro_lr-sweep.2", sweep=True)
    for name in ("a/b", "", "a b"):
        with pytest.raises(ConfigError, match=r"^--name .* may only hold letters, digits, '\.', '_' and '-'$"):
            naming.check_name(name, sweep=True)


def test_a_launcher_of_ones_own_in_config_dir_runs_as_the_kind_its_keys_say(isolated):
    """conf/launcher/ is the one list of launchers: a file added through --config-dir is one (it was refused),
    run by the launcher whose keys it has: slurm: keys submit to SLURM, local: keys run here."""
    from conftest import TINY

    from tiecli.cli import app
    from tiecli.sweep import scheduler

    mine = isolated / "mine" / "launcher"
    mine.mkdir(parents=True)
    slurm = (default_config_dir() / "launcher" / "submitit_slurm.yaml").read_text()
    (mine / "a100.yaml").write_text(slurm.replace("partition: null", "partition: a100"))
    (mine / "four_threads.yaml").write_text("local:\n  threads_per_job: 4\n")
    args = ["sweep", *TINY, "seed=0,1", "--launcher", "a100", "--config-dir", "mine", "--dry-run", "--no-estimate"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "submitit_slurm: the 2 job(s) to run go to SLURM as one array with" in result.output.splitlines()
    assert "#SBATCH --partition=a100" in {line.strip() for line in result.output.splitlines()}
    own = scheduler.launch_options("four_threads", [], isolated / "mine", None, None)
    assert (own.name, own.settings.kind, own.settings.local) == (
        "four_threads",
        "basic",
        LocalLauncher(threads_per_job=4),
    )
    kinds = {
        name: scheduler.launch_options(name, [], None, None, None).settings.kind for name in ("basic", "submitit_local")
    }
    assert kinds == {"basic": "basic", "submitit_local": "submitit_local"}


def test_a_launcher_file_is_refused_in_one_line_when_its_kind_cannot_run(isolated):
    from tiecli.config.compose import compose_launcher

    mine = isolated / "mine" / "launcher"
    mine.mkdir(parents=True)
    (mine / "both.yaml").write_text("local:\n  threads_per_job: 1\nslurm:\n  time: 5\n")
    with pytest.raises(ConfigError, match=r"both\.yaml' has keys local, slurm; a launcher file has local: keys"):
        compose_launcher("both", [], isolated / "mine")
    # submitit's local executor needs its time limit and warning (it failed on an assert when they were null)
    with pytest.raises(ConfigError, match=r"^launcher.local.timeout_min and signal_delay_s are submitit's time limit"):
        compose_launcher("submitit_local", ["launcher.local.timeout_min=null"])
    (mine / "no_limit.yaml").write_text("local:\n  threads_per_job: null\n  timeout_min: null\n  signal_delay_s: 90\n")
    with pytest.raises(ConfigError, match=r"^launcher.local.timeout_min and signal_delay_s are submitit's time limit"):
        compose_launcher("no_limit", [], isolated / "mine")  # a submitit_local by its keys, even with a null in one


def test_an_old_run_reads_the_keys_conf_gained_at_confs_defaults_but_added_at_its_old_behaviour(tmp_path):
    """A run's config.yaml is recomposed over conf/'s defaults for its own group choices: a run written today reads
    back as written, key order included; one written before a key existed gets conf/'s default for it, except the
    keys in ADDED, whose old behaviour differs from conf/'s default (eval.max_tokens: whole splits, not 2M tokens)."""
    from tiecli.config.compose import ADDED, from_run, recompose
    from tiecli.run.records import flatten

    stored, choices = compose(["model=nano", "tying=untied", "train.lr=0.001"])
    today = OmegaConf.to_container(stored)
    assert OmegaConf.to_yaml(recompose(today, choices)) == OmegaConf.to_yaml(stored)
    old = OmegaConf.to_container(stored)
    for section, key in (("eval", "max_tokens"), ("train", "checkpoints"), ("train", "sample_tokens")):
        del old[section][key]
    del old["logger"]
    c = from_run(old, choices, tmp_path / "config.yaml")
    assert (
        (c.eval.max_tokens, c.train.checkpoints)
        == (ADDED["eval.max_tokens"], ADDED["train.checkpoints"])
        == (None, None)
    )
    assert to_config(stored).eval.max_tokens == 2097152  # what a new run gets: ADDED's value is data, not the default
    assert (c.train.sample_tokens, c.logger.tensorboard, c.train.lr, c.model.n_layer) == (0, None, 0.001, 2)
    assert set(ADDED) <= set(flatten(today))  # every ADDED key is one conf/ still defines
    # a choice conf/ no longer has: the stored config is checked as it is, and named
    gone = {**choices, "model": "gone"}
    assert from_run(today, gone, tmp_path / "config.yaml").model.n_layer == 2
    with pytest.raises(TiecliError, match=r"^'.*config\.yaml' is not a valid tiecli config: eval\.max_tokens is requi"):
        from_run(old, gone, tmp_path / "config.yaml")


def _read_elsewhere(group: str) -> list[tuple[str, str, list[str]]]:
    """conf/'s own cases where a choice of `group` does not read a key another choice reads:
    (choice, override, the choices that read it), found from the files as a user reads them."""
    dirs = [default_config_dir()]
    cases = []
    for choice in readers.choices_of(group, dirs):
        unused = readers.file_keys(group, choice, dirs)[1]
        mine = set(compose([f"{group}={choice}"])[0][group].keys())  # conf/config.yaml's model.block_size too
        for key in sorted({k for c in readers.choices_of(group, dirs) for k in readers.file_keys(group, c, dirs)[0]}):
            if key in mine and key not in unused:
                continue
            reading = readers.readers(group, key, dirs)
            value = next(
                (v for c in reading if (v := readers.file_keys(group, c, dirs)[0][key]) not in (None, "???")), "x"
            )
            cases.append((choice, f"{group}.{key}={str(value).lower() if isinstance(value, bool) else value}", reading))
    return cases


@pytest.mark.parametrize("group", [g for g in GROUPS if g not in LIST_GROUPS])
def test_a_key_only_another_choice_reads_is_refused_naming_it(group):
    """Every group: data.path with data=shakespeare, tying.rank with tying=tied, tokenizer.train_bytes with
    tokenizer=bytes... would be ignored; each is refused in one line naming the choice that reads it, and
    accepted with that choice."""
    cases = _read_elsewhere(group)
    expected = {"model": 0, "tying": 4, "data": 5, "tokenizer": 1}  # conf/'s own files: model's all read the same keys
    assert len({line for _, line, _ in cases}) >= expected[group], cases
    for choice, line, reading in cases:
        with pytest.raises(ConfigError) as e:
            compose([f"{group}={choice}", line])
        key = line.split("=", 1)[0]
        assert f"{key} is read by " in str(e.value) and all(f"{group}={c}" in str(e.value) for c in reading)
        assert f"not by {group}={choice}" in str(e.value) and "\n" not in str(e.value)
        cfg, choices = compose([f"{group}={reading[0]}", line])
        assert choices[group] == reading[0] and str(OmegaConf.select(cfg, key)).lower() == line.split("=", 1)[1]


def test_the_default_choice_refuses_what_it_would_ignore():
    """Without the group on the command line, the default choice is the one that must read the key."""
    for line, reader in [
        ("data.path=/usr/share/common-licenses/GPL-3", "data=textfile"),
        ("tying.shared_fraction=0.25", "tying=partial"),
        ("data.hf_split=train", "data=hf"),
    ]:
        with pytest.raises(ConfigError, match=f"only, not by .*; add {reader}$"):
            compose([line])


@pytest.mark.parametrize("line", ["data.name=textfile", "tying.mode=partial", "tokenizer.name=gpt2"])
def test_the_key_naming_the_choice_changes_only_with_the_choice(line):
    """data.name=textfile alone would read data=shakespeare's keys under another name; the choice picks it."""
    group = line.split(".")[0]
    with pytest.raises(ConfigError, match=f"names the {group} choice itself; pick one with {group}=CHOICE"):
        compose([line])


def test_a_config_dir_file_marks_its_own_unused_keys(tmp_path):
    """A user's data file that does not read data.split says so as tiecli's do, and gets the same refusal."""
    (tmp_path / "data").mkdir()
    own = (default_config_dir() / "data" / "shakespeare.yaml").read_text()
    (tmp_path / "data" / "mine.yaml").write_text(
        own.replace("name: shakespeare", "name: shakespeare  # my copy").replace(
            "n_blocks: 100 ", "n_blocks: 100  # unused: split is always document here"
        )
    )
    with pytest.raises(ConfigError, match=r"data.n_blocks is read by data=docs_en, .* not by data=mine \(the data"):
        compose(["data=mine", "data.n_blocks=5"], tmp_path)
    assert compose(["data=mine", "data.split_seed=5"], tmp_path)[0].data.split_seed == 5
    (tmp_path / "tokenizer").mkdir()  # a bpe.yaml of one's own that marks train_bytes unused: no choice reads it now
    bpe = (default_config_dir() / "tokenizer" / "bpe.yaml").read_text()
    (tmp_path / "tokenizer" / "bpe.yaml").write_text(bpe.replace("100000000 ", "100000000  # unused here "))
    with pytest.raises(ConfigError, match="tokenizer=bpe does not read tokenizer.train_bytes"):
        compose(["tokenizer.train_bytes=5"], tmp_path)
