"""The trainer's advantage whitening divides by the population std, as its comment says."""

import torch

from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import Rows


def test_whitening_uses_the_population_std_not_verls_unbiased_one():
    # one response of 3 tokens, reward 3 at its end, values [2, 1, 0]; λ = γ = 1, so A_t = R − V_t
    # = [1, 2, 3]: mean 2, population std sqrt(2/3) = 0.81650, whitened [−1.22474, 0, 1.22474]
    # (verl's masked_whiten divides by sqrt(unbiased variance) = 1 and would give [−1, 0, 1])
    cfg = typed(
        compose_config(
            algo="ppo", overrides=["gae.lam_policy=1.0", "gae.whiten=true"], check=False
        ).cfg
    )
    mask = torch.ones(1, 3, dtype=torch.bool)
    batch = Batch(
        rows=Rows(
            torch.zeros(1, 1, dtype=torch.long),
            mask[:, :1],
            torch.zeros(1, 3, dtype=torch.long),
            mask,
        ),
        problems=[None],
        scores=torch.tensor([3.0]),
        correct=torch.tensor([True]),
        lengths=torch.tensor([3]),
        truncated=torch.tensor([False]),
        old_logprobs=torch.zeros(1, 3),
        values=torch.tensor([[2.0, 1.0, 0.0]]),
    )
    compute_advantages(cfg.algo, cfg.gae, cfg.kl, cfg.rollout.n_samples, batch)
    torch.testing.assert_close(batch.returns, torch.tensor([[3.0, 3.0, 3.0]]))
    torch.testing.assert_close(
        batch.advantages, torch.tensor([[-1.224744, 0.0, 1.224744]]), atol=1e-5, rtol=0
    )
