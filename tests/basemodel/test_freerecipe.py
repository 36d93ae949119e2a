"""Tests for vapo_lab.basemodel.freerecipe: the mixture of lengths, the summary table, the build
config."""

import random

from vapo_lab.basemodel.build import base_config, config_hash
from vapo_lab.basemodel.freerecipe import FREE_DEFAULTS, PretrainView, summarize
from vapo_lab.basemodel.recipe import DEFAULTS
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arith import TraceNoise
from vapo_lab.tasks.arithfree import ArithFreeTask, LengthChoice, answer_words


def problem(x, y, n):
    return Problem("p", "", " ".join(answer_words(x, y, n)), {"n_digits": n, "x": x, "y": y})


def test_the_default_config_and_its_hash_are_untouched():
    # the embedded default's cache key (its shipped base model's folder name) must not move
    assert base_config() == DEFAULTS
    assert config_hash(base_config()) == config_hash(dict(DEFAULTS))
    free = base_config(task="arithfree")
    assert free["task"] == "arithfree" and "readout" not in free
    assert config_hash(free) != config_hash(base_config())


def test_pretrain_view_draws_the_length_then_writes_that_trace():
    task = ArithFreeTask(0, 10, 0)
    p = problem(457, 186, 3)
    direct = PretrainView(task, LengthChoice(direct_rate=1.0))
    assert direct.trace(p, random.Random(0), TraceNoise()) == " \\boxed{ r1_5 r2_3 r3_3 }"
    full = PretrainView(task, LengthChoice())
    assert full.trace(p, random.Random(0), TraceNoise()) == task.trace(p)
    assert full.train is task.train


def test_summarize_by_hand():
    task = ArithFreeTask(0, 0, 0)
    short, long = problem(5, 2, 1), problem(12345, 1, 5)
    texts = [
        [task.trace(short, columns=0), task.trace(short)],  # direct right, full right
        [task.trace(long, columns=0), " c5_0 z5_6"],
    ]  # direct: 12345 + 00001 has no carry -> right; cut off
    table = summarize(task, [short, long], texts, [[4, 5], [8, 3]])
    assert table["all"] == {
        "n": 4,
        "acc": 0.75,
        "length": 5.0,
        "share_direct": 0.5,
        "acc_direct": 1.0,
        "share_partial": 0.0,
        "share_full": 0.25,
        "acc_full": 1.0,
        "share_other": 0.25,
        "acc_other": 0.0,
    }
    assert table["d01_03"]["acc"] == 1.0 and table["d04_08"]["acc"] == 0.5
    assert FREE_DEFAULTS["task"] == "arithfree"


def test_model_base_overrides_the_tasks_digit_count_law_in_the_build_options():
    from vapo_lab.basemodel.build import base_options_for
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed

    def options(*overrides):
        c = typed(compose_config(overrides=["scale=cpu-free", *overrides]).cfg)
        return base_options_for(c.model, c.task)

    # scale=cpu-free: the RL task is uniform, its base pre-trained on P(n) ∝ n^-0.5 (the v3 base)
    c = typed(compose_config(overrides=["scale=cpu-free"]).cfg)
    assert c.task.options["length_exponent"] == 0.0
    mixed = options()
    assert mixed["task"] == "arithfree" and mixed["length_exponent"] == 0.5
    # without the override the base follows the task's law: another cache key
    uniform = options("~model.base.length_exponent")
    assert uniform["length_exponent"] == 0.0
    assert config_hash(base_config(**mixed)) != config_hash(base_config(**uniform))
