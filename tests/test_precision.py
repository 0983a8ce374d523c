"""dtype: bf16 only where the GPU has it natively, fp16 with a gradient scaler where it has fp16 tensor cores,
fp32 before them (tiecli/runtime/device.py); the fp16 path trained on CPU, where autocast and GradScaler also run."""

import json

import pytest
import torch
from conftest import TINY
from helpers import rows, tiecli

from tiecli.runtime import device as runtime

CUDA = torch.device("cuda", 0)


@pytest.fixture
def gpu(monkeypatch):
    """A pretended GPU: set(native_bf16, capability); is_bf16_supported() counts emulation unless told not to,
    as torch's does (V100 and T4 emulate bf16)."""
    state = {"native": True, "capability": (8, 0)}

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return state["native"] or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state["capability"])

    def set_(native: bool, capability: tuple[int, int]) -> None:
        state.update(native=native, capability=capability)

    return set_


@pytest.mark.parametrize(
    "native, capability, picked",
    [
        (True, (8, 0), "bf16"),
        (True, (9, 0), "bf16"),
        (False, (7, 0), "fp16"),
        (False, (7, 5), "fp16"),
        (False, (6, 0), "fp32"),
    ],
)  # A100, H100, V100, T4, P100
def test_auto_dtype_on_cuda_counts_only_native_bf16(gpu, native, capability, picked):
    gpu(native, capability)
    assert runtime.pick_dtype("auto", CUDA) == picked
    assert runtime.pick_dtype("bf16", CUDA) == "bf16"  # asked for: given, even where emulated
    scaler = runtime.grad_scaler(torch.device("cpu"), picked)
    assert (scaler is not None) == (picked == "fp16")


def test_torch_without_including_emulation_falls_back(monkeypatch):
    """torch before 2.5 has no including_emulation keyword (and no emulation to count)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert runtime.pick_dtype("auto", CUDA) == "bf16"


@pytest.mark.slow
def test_fp16_trains_with_a_scaler_resumes_exactly_and_its_diagnostics_are_unscaled(isolated):
    """dtype=fp16 (what auto picks on a V100 or T4), here on CPU: summary.json says fp16, the checkpoint keeps
    the scaler's state, a resume continues exactly, and the gradient statistics (read while the gradients are
    still multiplied by the loss scale, 65,536 at first) agree with an fp32 run's."""
    base = [o for o in TINY if o != "train.max_steps=12"] + ["diag.every=5", "train.lr=3e-3", "train.min_lr=3e-3"]
    for name, extra in (("fp16", ["dtype=fp16"]), ("fp32", ["dtype=fp32"]), ("half", ["dtype=fp16"])):
        steps = "train.max_steps=6" if name == "half" else "train.max_steps=12"
        result = tiecli("train", *base, *extra, steps, "compile=false", "--name", name)
        assert result.exit_code == 0, result.output
    result = tiecli("train", "--resume", "runs/half", "train.max_steps=12")
    assert result.exit_code == 0, result.output
    runs = isolated / "runs"
    summary = json.loads((runs / "fp16" / "summary.json").read_text())
    assert summary["dtype"] == "fp16" and summary["status"] == "completed"
    scaler = torch.load(runs / "fp16" / "checkpoints" / "last.pt", weights_only=True)["scaler"]
    assert scaler["scale"] > 1 and scaler["_growth_tracker"] == 12  # no overflow in 12 steps
    fp16, fp32, resumed = rows(runs / "fp16"), rows(runs / "fp32"), rows(runs / "half")
    assert fp16.keys() == fp32.keys() == resumed.keys()
    for step, row in fp16.items():
        assert resumed[step] | {"tokens_per_s": 0} == row | {"tokens_per_s": 0}, step
        for key in ("loss", "grad_norm", "grad_cos", "grad_norm_in", "grad_norm_out"):
            if key in row:
                assert row[key] == pytest.approx(fp32[step][key], rel=0.05), (step, key)
    assert sum("grad_norm_in" in row for row in fp16.values()) == 2
