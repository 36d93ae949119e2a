"""Pure tensor maths of VAPO and its baselines: GAE, PPO losses, group advantages, KL.

Every function takes tensors and returns tensors: no config, logging or device moves. Shapes use
B responses, T response tokens, G samples per prompt, V vocabulary size.
"""

from vapo_lab.algo.gae import decoupled_gae, gae, gae_reference, length_adaptive_lambda
from vapo_lab.algo.group import (
    dynamic_sampling_keep,
    group_advantages,
    overlong_penalty,
)
from vapo_lab.algo.kl import KL_ESTIMATORS, kl_estimate
from vapo_lab.algo.lm import (
    entropy_from_logits,
    masked_entropy,
    positive_nll_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)
from vapo_lab.algo.masked import masked_mean, masked_sum, masked_var
from vapo_lab.algo.policy import LOSS_AGG_MODES, aggregate_loss, ppo_policy_loss
from vapo_lab.algo.value import explained_variance, value_loss

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "aggregate_loss",
    "decoupled_gae",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "gae_reference",
    "group_advantages",
    "kl_estimate",
    "length_adaptive_lambda",
    "masked_entropy",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "overlong_penalty",
    "positive_nll_loss",
    "ppo_policy_loss",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "value_loss",
]
