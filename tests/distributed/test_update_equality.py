"""An update on 2 ranks (FSDP2 over gloo) equals the one-process update on the same global batch:
losses and metrics, gradients and parameters after the step, for the VAPO, PPO, DAPO and GRPO
presets (tests/distributed/rank_update.py: 2 optimiser steps per epoch, 2 epochs, micro-batches of
4, an old policy off the current one so that clipping is live), in float64, so that the two agree
to ~1e-15 and the bounds can be tight.

The optimiser is SGD, whose step is proportional to the gradient: AdamW would hide a gradient
off by a constant factor (NOTES-scale.md). The last test shows the check catching one: FSDP2's
default of averaging gradients over ranks, with our globally normalised losses, halves them.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import REPO, torchrun

SCRIPT = Path(__file__).with_name("rank_update.py")


def _one_process(preset: str, out: Path) -> dict:
    subprocess.run(
        [sys.executable, str(SCRIPT), preset, str(out), "--single"],
        check=True,
        cwd=REPO,
        capture_output=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    return torch.load(out, weights_only=True)


def _relative(a: dict, b: dict) -> float:
    """The largest |a − b| / max|a| over the tensors of two state dicts (same keys)."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)) for k in a)


@pytest.mark.parametrize("preset", ["vapo", "ppo", "dapo", "grpo"])
def test_two_ranks_update_equals_one_process(preset, tmp_path):
    ref = _one_process(preset, tmp_path / "one.pt")
    torchrun(2, SCRIPT, preset, str(tmp_path / "two.pt"))
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert ref["metrics"].keys() == two["metrics"].keys()
    for k, v in ref["metrics"].items():
        assert two["metrics"][k] == pytest.approx(v, rel=1e-10, abs=1e-12), k
    assert torch.allclose(ref["advantages"], two["advantages"], rtol=0, atol=1e-12)
    groups = ["policy", "policy_grad"] + (["critic", "critic_grad"] if "critic" in ref else [])
    assert preset in ("dapo", "grpo") or "critic" in ref  # the presets with a critic train it here
    for g in groups:
        assert len(ref[g]) > 0
        # float64: largest seen 2.4e-15 (PPO's critic gradient); in float32 it was up to 5.0e-5
        assert _relative(ref[g], two[g]) < 1e-12, g
    # real gradients (a model that got none would match trivially)
    assert all(
        float(ref[g][k].abs().max()) > 0 for g in groups if g.endswith("_grad") for k in ref[g]
    )


def test_the_check_catches_gradients_averaged_over_ranks(tmp_path):
    ref = _one_process("vapo", tmp_path / "one.pt")
    torchrun(2, SCRIPT, "vapo", str(tmp_path / "avg.pt"), "--average")
    avg = torch.load(tmp_path / "avg.pt", weights_only=True)
    # on the first mini-batch every gradient is half the true one: the weights end visibly apart
    assert _relative(ref["policy"], avg["policy"]) > 1e-3
    assert _relative(ref["critic"], avg["critic"]) > 1e-2
