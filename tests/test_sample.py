"""`tiecli sample`: every tying mode, reproducible by seed, the model's own log-probabilities, and bad input."""

import json
from pathlib import Path

import pytest
import tiktoken
import torch
from conftest import TINY
from helpers import one_line_error, tiecli

from tiecli.commands.sample import Options, draw, encode_prompt, load_sampling, pick, sample_run
from tiecli.config.checks import to_config
from tiecli.config.compose import compose, to_yaml
from tiecli.config.schema import TYING_MODES
from tiecli.data import tokenizer
from tiecli.errors import TiecliError
from tiecli.model import checkpoint
from tiecli.model.gpt import GPT
from tiecli.run.layout import CHECKPOINT, CONFIG, OVERRIDES
from tiecli.run.records import Summary
from tiecli.run.writer import RunWriter


def make_run(path: Path, *overrides: str, weights: bool = True):
    """A run directory whose checkpoint holds a freshly initialised model (seed 1) at step 0: no training needed."""
    cfg, choices = compose([*TINY, *overrides])
    c = to_config(cfg)
    summary = Summary(
        path.name, "completed", 0, {}, 12, 128, 0, 0, "cpu", "fp32", False, {}, {}, "2026-01-01T00:00:00+00:00"
    )
    files = {CONFIG: to_yaml(cfg), OVERRIDES: f"overrides: []\nchoices: {json.dumps(choices)}\n"}
    model = GPT(c.model, seed=1)
    with RunWriter.create(path, files, summary, b"") as run:
        if weights:
            ckpt = {"model": model.state_dict(), "optimizer": {}, "rng": {}, "state": {"step": 0}}
            run.save(CHECKPOINT, checkpoint.to_bytes(ckpt))
    return c, model.eval()


def options(**changes) -> Options:
    values = {"prompt": "\n", "num_samples": 2, "max_new_tokens": 16, "temperature": 1.0, "top_k": 0}
    return Options(**{**values, "top_p": 1.0, "seed": 3, **changes})


def model_logprobs(model: GPT, prompt_ids: list[int], ids: list[int]) -> torch.Tensor:
    """log p(ids[j] | prompt, ids[:j]) by one forward pass over the whole sequence."""
    seq = torch.tensor([prompt_ids + ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(seq[:, :-1]).float(), dim=-1)[0]  # (T-1, V)
    return logprobs[len(prompt_ids) - 1 :].gather(1, torch.tensor(ids)[:, None])[:, 0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", TYING_MODES)
def test_every_mode_samples_reproducibly_with_its_own_logprobs(tmp_path, mode):
    c, model = make_run(tmp_path / mode, f"tying={mode}")
    # Hot: an untrained `scaled` model (std 1.0 rows) puts 97% on repeating its input token.
    first = sample_run(tmp_path / mode, c, "latest", options(temperature=5.0))
    assert first == sample_run(tmp_path / mode, c, "latest", options(temperature=5.0))  # same seed, same samples
    assert first.prompt_ids == [10] and first.samples[0] != first.samples[1]  # each sample its own stream
    for s in first.samples:
        assert len(s.ids) == 16 and s.text == tokenizer.byte_level().decode(s.ids, errors="replace")
        torch.testing.assert_close(torch.tensor(s.logprobs), model_logprobs(model, [10], s.ids), atol=1e-5, rtol=0)


def test_greedy_filters_and_streams(tmp_path):
    c, model = make_run(tmp_path / "run")
    run = tmp_path / "run"
    three = sample_run(run, c, "latest", options(num_samples=3, prompt="ROMEO:"))
    one = sample_run(run, c, "latest", options(num_samples=1, prompt="ROMEO:")).samples[0]
    assert one.ids == three.samples[0].ids  # (log-probabilities may differ in the last digits: batched matmuls)
    assert sample_run(run, c, "latest", options(num_samples=1, prompt="ROMEO:", seed=4)).samples[0].ids != one.ids
    greedy = sample_run(run, c, "latest", options(temperature=0.0, prompt="ROMEO:")).samples[0]
    seq = three.prompt_ids + greedy.ids
    with torch.no_grad():
        argmax = model(torch.tensor([seq[:-1]]))[0].argmax(dim=-1)[len(three.prompt_ids) - 1 :]
    assert greedy.ids == argmax.tolist()
    for narrow in (options(top_k=1, prompt="ROMEO:"), options(top_p=1e-9, prompt="ROMEO:")):
        assert sample_run(run, c, "latest", narrow).samples[0].ids == greedy.ids


def test_past_block_size_the_window_slides_as_without_a_cache(tmp_path):
    c, model = make_run(tmp_path / "run")  # block_size 32: 16 prompt tokens + 40 new run 24 past it
    o = options(temperature=0.0, num_samples=1, prompt="ROMEO: tell me, ", max_new_tokens=40)
    got = sample_run(tmp_path / "run", c, "latest", o)
    seq = list(got.prompt_ids)
    with torch.no_grad():
        for _ in range(40):  # the reference: the whole window through GPT.forward for every token, no cache
            seq.append(int(model(torch.tensor([seq[-32:]]))[0, -1].argmax()))
    assert len(got.prompt_ids) == 16 and got.samples[0].ids == seq[16:]


def test_pick_draws_from_the_filtered_distribution():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for u, top_p, expected in ((0.0, 1.0, 0), (0.49, 1.0, 0), (0.51, 1.0, 1), (0.97, 1.0, 3), (0.7, 0.8, 1)):
        o = options(top_p=top_p)
        assert pick(logits, o, torch.tensor([u], dtype=torch.float64)).item() == expected, (u, top_p)
    # top_p=0.8 keeps 0.5 + 0.3: u spreads over that mass alone; top_k=2 keeps the same two.
    for o in (options(top_p=0.8), options(top_k=2)):
        picks = {pick(logits, o, torch.tensor([u / 100], dtype=torch.float64)).item() for u in range(100)}
        assert picks == {0, 1}


@pytest.mark.slow
def test_cli_sample_json_compare_and_the_sample_after_training(tmp_path):
    result = tiecli("train", *TINY, "train.sample_tokens=24", "--name", "t")
    assert result.exit_code == 0, result.output
    printed = result.output[result.output.index("prompt '\\n'") :]
    again = tiecli("sample", tmp_path / "runs" / "t", "--max-new-tokens", 24)
    assert again.exit_code == 0 and again.output == printed  # the same defaults: `tiecli sample` reproduces it
    shown = json.loads(tiecli("sample", tmp_path / "runs" / "t", "--max-new-tokens", 24, "--json").output)
    assert shown["step"] == 12 and "\n" + shown["samples"][0]["text"] in printed
    assert len(shown["samples"][0]["ids"]) == len(shown["samples"][0]["logprobs"]) == 24
    make_run(tmp_path / "runs" / "fresh")
    args = ("--num-samples", 2, "--max-new-tokens", 8, "--seed", 5, "--json")
    both = json.loads(tiecli("sample", tmp_path / "runs" / "t", "--compare", tmp_path / "runs" / "fresh", *args).output)
    alone = [json.loads(tiecli("sample", tmp_path / "runs" / r, *args).output) for r in ("t", "fresh")]
    assert both == alone and [r["run"] for r in both] == ["t", "fresh"]
    table = tiecli("sample", tmp_path / "runs" / "t", "--compare", tmp_path / "runs" / "fresh", "--max-new-tokens", 8)
    assert table.exit_code == 0 and "t (step 12)" in table.output and "fresh (step 0)" in table.output


@pytest.mark.slow
def test_bad_input_is_one_line(tmp_path):
    make_run(tmp_path / "bare", weights=False)
    make_run(tmp_path / "run")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    run = tmp_path / "run"
    one_line_error(tiecli("sample", tmp_path / "bare"), 1, "run bare has no checkpoint (checkpoints/last.pt)")
    one_line_error(tiecli("sample", tmp_path / "nowhere"), 1, "is not a run directory")
    one_line_error(tiecli("sample", run, "--prompt", "a", "--prompt-file", "p.txt"), 2, "not both")
    one_line_error(tiecli("sample", run, "--prompt-file", "p.txt"), 1, "--prompt-file 'p.txt' does not exist")
    one_line_error(tiecli("sample", run, "--prompt-file", tmp_path / "latin1.txt"), 1, "is not UTF-8 text (byte 3)")
    one_line_error(tiecli("sample", run, "--prompt", ""), 2, "the prompt is empty")
    one_line_error(tiecli("sample", run, "--step", "7"), 1, "full weights only at step 0; choose latest or 0")
    one_line_error(tiecli("sample", run, "--temperature", "-1"), 2, "--temperature -1.0 must be a finite number >= 0")
    one_line_error(tiecli("sample", run, "--top-k", "-1"), 2, "--top-k -1 must be >= 0 (0: every token)")
    one_line_error(tiecli("sample", run, "--num-samples", "0"), 2, "--num-samples 0 must be at least 1")
    one_line_error(tiecli("sample", run, "--top-p", "1.5"), 2, "--top-p 1.5 must be in (0, 1]")


def test_a_prompt_the_tokenizer_cannot_encode():
    ascii_only = tiktoken.Encoding(
        "ascii", pat_str=r"[\s\S]", mergeable_ranks={bytes([b]): b for b in range(128)}, special_tokens={}
    )
    with pytest.raises(TiecliError, match=r"character 'é' \(position 1\) is not in tokenizer ascii's vocabulary"):
        encode_prompt(ascii_only, "hé", 128)
    with pytest.raises(TiecliError, match="is not valid UTF-8 text"):
        encode_prompt(ascii_only, "h\udcff", 128)  # a command line's undecodable byte
    text = "naïve 🙂 — ok"  # bytes cover everything
    assert tokenizer.byte_level().decode(encode_prompt(tokenizer.byte_level(), text, 256)) == text


@pytest.mark.slow
def test_one_sample_streams_token_by_token_and_long_prompts_are_cut(tmp_path):
    c, _ = make_run(tmp_path / "run")
    o = options(num_samples=1, max_new_tokens=40, prompt="ROMEO:")
    chunks: list[str] = []
    streamed = draw(load_sampling(tmp_path / "run", c, "latest", o), stream=chunks.append)
    assert len(chunks) >= 10 and "".join(chunks) == streamed.samples[0].text  # as drawn, and all of it
    assert streamed == sample_run(tmp_path / "run", c, "latest", o)  # streaming changes nothing drawn

    prompt = "To be, or not to be, that is the question:\n" * 100  # 4,300 characters
    result = tiecli("sample", tmp_path / "run", "--prompt", prompt, "--max-new-tokens", 5)
    assert result.exit_code == 0, result.output
    assert "(4,300 characters)" in result.output.splitlines()[0] and len(result.output) < 600
    assert result.output.count("that is the question") <= 5  # the prompt's end, not all of it


def test_absurd_options_are_refused_or_clamped_with_a_note(tmp_path):
    make_run(tmp_path / "run")
    run = tmp_path / "run"
    one_line_error(tiecli("sample", run, "--temperature", "inf"), 2, "--temperature inf must be a finite number >= 0")
    one_line_error(tiecli("sample", run, "--temperature", "nan"), 2, "--temperature nan must be a finite number")
    one_line_error(tiecli("sample", run, "--step", "abc"), 2, "--step 'abc' must be latest or a step number")
    result = tiecli("sample", run, "--top-k", 10**9, "--max-new-tokens", 4)
    assert result.exit_code == 0, result.output
    assert "note: --top-k 1000000000 is more than the vocabulary's 256 tokens; every token is kept" in result.output
    assert "top-k 256" in result.output
