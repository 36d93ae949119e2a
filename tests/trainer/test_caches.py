"""The critic's caches: keys that a resumed run finds again, and the shipped default's entries."""

import pytest
from omegaconf import OmegaConf

from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.trainer.caches import (
    critic_cache_keys,
    critic_start_key,
    pretrained_critic_key,
    reward_model_key,
)


def test_cache_keys_are_the_same_for_a_composed_and_a_resumed_config():
    cfg = compose_config(overrides=[], check=False).cfg
    # the composed config holds interpolations
    assert "${" in str(OmegaConf.to_container(cfg.reward))
    # what config.yaml gives on resume
    saved = OmegaConf.create(OmegaConf.to_yaml(cfg, resolve=True))
    assert reward_model_key("p", typed(cfg)) == reward_model_key("p", typed(saved))
    assert pretrained_critic_key("c", typed(cfg)) == pretrained_critic_key("c", typed(saved))


def test_every_setting_that_shapes_the_reward_model_is_in_its_key():
    base = typed(compose_config(overrides=[], check=False).cfg)
    changed = [
        "critic.rm_lr=2e-3",
        "critic.rm_tokens_per_step=777",
        "rollout.top_p=0.9",
        "trainer.grad_clip=0.5",
        "model.dtype=bfloat16",
        "critic.rm_batch=32",
    ]
    keys = {reward_model_key("p", base)}
    for override in changed:
        cfg = typed(compose_config(overrides=[override], check=False).cfg)
        keys.add(reward_model_key("p", cfg))
    assert len(keys) == 1 + len(changed)


def test_the_prefix_reward_model_is_keyed_apart_and_the_defaults_keys_do_not_move():
    plain = typed(compose_config(overrides=[], check=False).cfg)
    prefix = typed(compose_config(overrides=["critic.init=reward_model_prefix"]).cfg)
    assert reward_model_key("p", plain) != reward_model_key("p", prefix)
    assert critic_start_key("p", prefix) == f"rm:{reward_model_key('p', prefix)}"
    assert set(critic_cache_keys("p", prefix)) == {"reward_model", "pretrained_critic"}
    assert critic_cache_keys("p", plain)["reward_model"] == reward_model_key("p", plain)


def test_the_shared_filesystem_check_comes_right_after_the_ranks_join_before_any_load(monkeypatch):
    from vapo_lab.errors import ConfigError
    from vapo_lab.trainer import setup

    done = []

    class Blind:
        def require_shared(self, folders):
            done.append(("shared", sorted(str(p) for p in folders.values())))
            raise ConfigError("rank 1 does not see runs")

    monkeypatch.setattr(setup, "init_world", lambda trainer, device: Blind())
    monkeypatch.setattr(setup, "checked_policy", lambda *a: done.append("load"))
    config = typed(compose_config(overrides=["output_dir=shared/runs"]).cfg)
    with pytest.raises(ConfigError, match="does not see"):
        setup.build_parts(config, lambda text: None)
    assert done == [("shared", [".vapo_cache", "shared/runs"])]
