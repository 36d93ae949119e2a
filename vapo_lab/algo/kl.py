"""Per-token estimators of KL(π‖π_ref) from samples of π (Schulman 2020, "Approximating KL")."""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")
# where a KL term to the reference policy goes: the loss (GRPO) or the per-token reward
KL_TARGETS = ("loss", "reward")


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(π‖π_ref) on tokens sampled from π.

    With the log ratio ℓ = log π(y) − log π_ref(y):
        k1 = ℓ                  (unbiased, high variance, can be negative)
        k2 = ½·ℓ²               (biased, low variance)
        k3 = exp(−ℓ) − 1 + ℓ    (unbiased, low variance, ≥ 0)

    Args:
        logprobs: log π(y_t), shape (B, T).
        ref_logprobs: log π_ref(y_t), shape (B, T).
        estimator: one of KL_ESTIMATORS.

    Returns:
        (B, T) per-token estimates; reduce them with a masked mean.

    Raises:
        ValueError: if estimator is not one of KL_ESTIMATORS.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"estimator={estimator!r} is not a KL estimator. Choose one of "
            f"{', '.join(KL_ESTIMATORS)} (k3 is non-negative and unbiased)."
        )
    log_ratio = logprobs - ref_logprobs  # ℓ = log π − log π_ref
    if estimator == "k1":
        return log_ratio  # k1 = ℓ
    if estimator == "k2":
        return 0.5 * log_ratio**2  # k2 = ½ℓ²
    return torch.exp(-log_ratio) - 1.0 + log_ratio  # k3 = exp(−ℓ) − 1 + ℓ
