"""`vapo-lab bench scale`: the summary arithmetic on hand-made numbers and (slow) a real round."""

import json
import math

import pytest
from typer.testing import CliRunner

from tests.trainer.conftest import SMALL as TRAINER_SMALL
from vapo_lab.bench.scale import (
    OWNED_KEYS,
    STEP_RECORD,
    VARIANTS,
    Spread,
    check_overrides,
    comm_summary,
    format_scale_benchmark,
    rank_command,
    run_figures,
    spread,
    summarize,
    union_length,
)
from vapo_lab.errors import ConfigError


def test_union_counts_overlaps_once():
    # [0, 2] and [1, 3] cover [0, 3]: 3; [5, 6] holds [5.5, 5.8]: 1; [7, 7] is empty
    assert union_length([(5, 6), (0, 2), (1, 3), (5.5, 5.8), (7, 7)]) == pytest.approx(
        4.0, abs=1e-9
    )
    assert union_length([]) == 0.0


def test_comm_summary_of_a_hand_made_profile():
    main, gloo_a, gloo_b = 1, 7, 8
    spans = [
        (STEP_RECORD, main, 100.0, 1100.0),  # the step: 1000 µs
        (
            "gloo:all_gather",
            gloo_a,
            200.0,
            400.0,
        ),  # overlaps the next: together [200, 500] = 300 µs
        ("gloo:all_reduce", gloo_b, 300.0, 500.0),
        ("gloo:all_reduce", gloo_a, 1000.0, 1300.0),  # clipped to [1000, 1100]: 100 µs
        ("gloo:all_gather", gloo_a, 0.0, 50.0),  # before the step: not counted
        ("c10d::allreduce_", main, 290.0, 300.0),
        ("c10d::allreduce_", main, 990.0, 1000.0),
        ("c10d::_allgather_base_", main, 190.0, 200.0),
        ("fsdp::all_gather_copy_in", main, 150.0, 180.0),  # 30 µs
        ("FSDP::all_gather_copy_out (model.layers.0)", main, 400.0, 420.0),  # 20 µs
        ("aten::mm", main, 600.0, 900.0),  # compute: none of the counts
    ]
    c = comm_summary(spans)
    assert c["step_s"] == pytest.approx(1000e-6, abs=1e-12)
    assert c["comm_s"] == pytest.approx(400e-6, abs=1e-12)  # 300 + 100 µs
    assert c["share"] == pytest.approx(0.4, abs=1e-9)
    assert c["ops"] == {
        "all_gather": {"count": 1, "seconds": pytest.approx(200e-6, abs=1e-12)},
        "all_reduce": {"count": 2, "seconds": pytest.approx(300e-6, abs=1e-12)},
    }
    assert c["calls"] == {"c10d::_allgather_base_": 1, "c10d::allreduce_": 2}
    assert c["fsdp_copy_s"] == pytest.approx(50e-6, abs=1e-12)


def test_comm_summary_without_collectives_or_step():
    assert comm_summary([(STEP_RECORD, 1, 0.0, 2e6), ("aten::mm", 1, 0.0, 1e6)])["share"] == 0.0
    with pytest.raises(ValueError, match="bench::step"):
        comm_summary([("gloo:all_reduce", 2, 0.0, 1.0)])


def test_spread_is_median_min_max_without_nan():
    assert spread([3.0, 1.0, 2.0, float("nan")]) == Spread(2.0, 1.0, 3.0, 3)
    assert spread([1.0, 2.0, 3.0, 10.0]).median == 2.5  # even count: mean of the middle two
    assert spread([float("nan")]).n == 0 and math.isnan(spread([]).median)


def _step(wall, cpu, tokens, step, rollout, critic, actor):
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens": tokens,
        "step_s": step,
        "rollout_s": rollout,
        "critic_s": critic,
        "actor_s": actor,
    }


def test_run_figures_of_a_hand_made_run():
    record = {
        "steps": [
            _step(2.0, 3.0, 1000, 1.9, 0.5, 0.6, 0.7),
            _step(4.0, 5.0, 2000, 3.9, 1.0, 1.2, 1.5),
            _step(3.0, 4.0, 1500, 2.9, 0.8, 0.9, 1.0),
        ],
        "profiled": {"comm": {"step_s": 5.0, "comm_s": 1.0, "share": 0.2, "fsdp_copy_s": 0.1}},
    }
    f = run_figures(record)
    # tokens summed over wall summed
    assert f["tokens_per_s"] == pytest.approx(4500 / 9.0, abs=1e-9)
    assert f["cpu_use"] == pytest.approx(12.0 / 9.0, abs=1e-9)
    assert f["wall_s"] == 3.0 and f["step_s"] == 2.9 and f["tokens_per_step"] == 1500  # medians
    # prep = step − rollout − critic − actor per step: 0.1, 0.2, 0.2 -> median 0.2
    assert f["prep_s"] == pytest.approx(0.2, abs=1e-9)
    assert f["comm_share"] == 0.2 and f["comm_s"] == 1.0 and f["profiled_step_s"] == 5.0
    assert math.isnan(run_figures({**record, "profiled": None})["comm_share"])


def _figures(tokens_per_s, wall_s):
    base = {
        k: 1.0
        for k in (
            "tokens_per_step",
            "cpu_use",
            "step_s",
            "rollout_s",
            "prep_s",
            "critic_s",
            "actor_s",
            "comm_share",
            "comm_s",
            "fsdp_copy_s",
            "profiled_step_s",
        )
    }
    return {**base, "tokens_per_s": tokens_per_s, "wall_s": wall_s}


def test_summary_spreads_over_rounds_and_ratios_round_by_round():
    rounds = [
        {
            "single": _figures(1200.0, 2.0),
            "fsdp-1": _figures(1000.0, 2.5),
            "fsdp-2": _figures(600.0, 4.0),
        },
        {
            "single": _figures(1000.0, 2.4),
            "fsdp-1": _figures(800.0, 3.0),
            "fsdp-2": _figures(600.0, 4.2),
        },
    ]
    s = summarize(rounds)
    assert list(s["variants"]) == ["single", "fsdp-1", "fsdp-2"]
    assert s["variants"]["fsdp-1"]["tokens_per_s"] == Spread(900.0, 800.0, 1000.0, 2)
    ratios = {(r["num"], r["den"]): r for r in s["ratios"]}
    # fsdp-2 / fsdp-1 tokens/s: 600/1000 = 0.6 and 600/800 = 0.75, paired by round (not 600/900)
    two_one = ratios[("fsdp-2", "fsdp-1")]["tokens_per_s"]
    assert (two_one.median, two_one.low, two_one.high) == pytest.approx(
        (0.675, 0.6, 0.75), abs=1e-12
    )
    # s/step: 4.0/2.5 = 1.6 and 4.2/3.0 = 1.4
    assert ratios[("fsdp-2", "fsdp-1")]["wall_s"].median == pytest.approx(1.5, abs=1e-12)
    # 600/1000
    assert ratios[("fsdp-2", "single")]["tokens_per_s"].high == pytest.approx(0.6, abs=1e-12)
    # 800/1000
    assert ratios[("fsdp-1", "single")]["tokens_per_s"].low == pytest.approx(0.8, abs=1e-12)
    assert summarize([{"fsdp-2": _figures(1.0, 1.0)}])["ratios"] == []  # nothing to pair


def test_the_variants_own_their_rank_keys():
    check_overrides(["rollout.responses_per_step=32", "trainer.max_tokens_per_micro_batch=256"])
    for key in OWNED_KEYS:
        with pytest.raises(ConfigError, match="sets .* itself"):
            check_overrides([f"{key}=x"])
    with pytest.raises(ConfigError, match=r"\+trainer.threads=1"):
        check_overrides(["+trainer.threads=1"])


def test_rank_commands_start_the_rank_module_by_name(tmp_path):
    single, fsdp1, fsdp2 = VARIANTS
    cmd = rank_command(single, tmp_path / "o.json", 1, 4, ["seed=3"], 2, tmp_path / "runs")
    assert "torch.distributed.run" not in cmd and cmd[1:3] == ["-m", "vapo_lab.bench.scale_rank"]
    assert "trainer.strategy=single" in cmd and "trainer.threads=2" in cmd and cmd[-1] == "seed=3"
    cmd = rank_command(fsdp2, tmp_path / "o.json", 1, 4, [], 1, tmp_path / "runs")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and "vapo_lab.bench.scale_rank" in cmd
    assert (
        "trainer.strategy=fsdp" in cmd
        and "trainer.nproc_per_node=2" in cmd
        and "tracking=none" in cmd
    )
    cmd = rank_command(fsdp1, tmp_path / "o.json", 1, 4, [], 2, tmp_path / "runs")
    assert cmd[cmd.index("--nproc-per-node") + 1] == "1" and "trainer.threads=2" in cmd


def test_the_report_says_no_speed_up_is_expected_on_two_cores():
    rounds = [
        {
            "single": _figures(1200.0, 2.0),
            "fsdp-1": _figures(1000.0, 2.5),
            "fsdp-2": _figures(600.0, 4.0),
        }
    ]
    result = {
        "rounds": 1,
        "steps": 4,
        "warmup": 1,
        "threads": 2,
        "cpus": 2,
        "overrides": [],
        "load": [1.0, 2.0],
        "summary": summarize(rounds),
    }
    text = format_scale_benchmark(result)
    assert "On 2 cores no speed-up is expected" in text
    assert "fsdp-2 / fsdp-1: tokens/s 0.60 [0.60-0.60]x" in text
    assert "2 ranks share the cores that 1 process uses with 2 threads" in text
    one = format_scale_benchmark({**result, "threads": 1})
    assert "On 2 cores no speed-up is expected: fsdp-2 has 2 threads to the others' 1" in one
    assert "1 thread a variant" in one
    assert "no speed-up" not in format_scale_benchmark({**result, "cpus": 16, "threads": 16})


# the trainer tests' small config (a base model, reward model and critic that build in seconds),
# less the keys the benchmark sets itself
SMALL = [o for o in TRAINER_SMALL if o.lstrip("+").split("=", 1)[0] not in OWNED_KEYS]


@pytest.mark.slow
def test_one_round_of_the_command_end_to_end(tmp_path, monkeypatch):
    """Every variant runs (caches built in a fresh working directory) and reports sane fields; no
    wall-clock assertions. About a minute on 2 cores."""
    from vapo_lab.cli import app

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "scale.json"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "scale",
            "--rounds",
            "1",
            "--steps",
            "2",
            "--threads",
            "2",
            "--out",
            str(out),
            *SMALL,
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert (
        record["rounds"] == 1
        and record["steps"] == 2
        and record["threads"] == 2
        and record["complete"]
    )
    runs, figures = record["runs"][0], record["figures"][0]
    assert set(runs) == set(figures) == {"single", "fsdp-1", "fsdp-2"}
    for name, run in runs.items():
        assert run["world_size"] == (2 if name == "fsdp-2" else 1)
        assert run["threads"] == (1 if name == "fsdp-2" else 2)
        assert len(run["warmup"]) == 1 and len(run["steps"]) == 2
        for step in run["steps"] + [run["profiled"]]:
            assert step["responses"] == 16  # the global batch, over all ranks
            assert 16 <= step["tokens"] <= 16 * 16  # 1..max_new_tokens tokens a response
            assert step["wall_s"] > 0 and step["cpu_s"] > 0
        f = figures[name]
        assert f["tokens_per_s"] > 0 and f["wall_s"] > 0 and math.isfinite(f["prep_s"])
        assert 0.0 <= f["comm_share"] < 1.0
    assert runs["single"]["profiled"]["comm"]["calls"] == {} and figures["single"]["comm_s"] == 0.0
    calls = runs["fsdp-2"]["profiled"]["comm"]["calls"]
    # FSDP2's
    assert calls["c10d::_allgather_base_"] > 0 and calls["c10d::_reduce_scatter_base_"] > 0
    assert calls["c10d::allreduce_"] > 0  # the trainer's global sums
    assert figures["fsdp-2"]["comm_share"] > 0.0
    summary = record["summary"]
    assert {(r["num"], r["den"]) for r in summary["ratios"]} == {
        ("fsdp-2", "fsdp-1"),
        ("fsdp-2", "single"),
        ("fsdp-1", "single"),
    }
    assert summary["variants"]["fsdp-2"]["tokens_per_s"]["n"] == 1
    for name in ("single", "fsdp-1", "fsdp-2", "fsdp-2 / fsdp-1: tokens/s", "comm share"):
        assert name in result.output
