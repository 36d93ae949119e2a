"""Helpers shared by the tests of vapo_lab.algo: dtypes, prefix masks, a float64 comparison.

Plain functions, imported by name (``from tests.algo.helpers import close, prefix_mask``); the
tests here share no fixture, so there is no conftest.
"""

import torch

F64 = torch.float64
F32 = torch.float32


def prefix_mask(lengths, T):
    """(B, T) bool mask with ones at t < lengths[b], zeros after."""
    return torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]


def close(actual, expected, atol=1e-6):
    """Asserts that actual equals expected within ``atol`` (absolute), both compared in float64."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64), atol=atol, rtol=0
    )
