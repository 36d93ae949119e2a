"""critic.init=reward_model_prefix has its own reward-model cache key; the default's keys do not move."""

from vapo_lab.config.compose import compose_config
from vapo_lab.trainer.critic_init import critic_cache_keys, critic_start_key, reward_model_key


def test_prefix_reward_model_is_keyed_apart_and_the_default_is_unchanged():
    plain = compose_config(overrides=[], check=False).cfg
    prefix = compose_config(overrides=["critic.init=reward_model_prefix"]).cfg
    assert reward_model_key("p", plain) != reward_model_key("p", prefix)
    assert critic_start_key("p", prefix).startswith("rm:")
    assert set(critic_cache_keys("p", prefix)) == {"reward_model", "pretrained_critic"}
    # the shipped entries of the embedded default (vapo_lab/shipped/) are found under these keys
    keys = critic_cache_keys("d0cebdec801c1fae", plain)
    assert keys == {"reward_model": "468e02a420fc12d6", "pretrained_critic": "130466a232c8c1c0"}
