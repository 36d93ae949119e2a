"""The critic's caches: a reward model and a pretrained critic are found again on resume."""

from omegaconf import OmegaConf

from vapo_lab.config.compose import compose_config
from vapo_lab.trainer.critic_init import pretrained_critic_key, reward_model_key


def test_cache_keys_are_the_same_for_a_composed_and_a_resumed_config():
    cfg = compose_config(overrides=[], check=False).cfg
    assert "${" in str(
        OmegaConf.to_container(cfg.reward)
    )  # the composed config holds interpolations
    saved = OmegaConf.create(
        OmegaConf.to_yaml(cfg, resolve=True)
    )  # what config.yaml gives on resume
    assert reward_model_key("p", cfg) == reward_model_key("p", saved)
    assert pretrained_critic_key("c", cfg) == pretrained_critic_key("c", saved)
