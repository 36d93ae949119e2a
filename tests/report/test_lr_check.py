"""reports/table1-plateau/lr_check.py against values worked out by hand: plateau score (steps 40
and 50 of 50) and learning speed (trapezoids / 50) of each preset at each lr, and the best-lr
comparison."""

import importlib.util
from pathlib import Path

from vapo_lab.registry.presets import PRESETS
from vapo_lab.track.export import write_export

SCRIPT = Path(__file__).resolve().parents[2] / "reports" / "table1-plateau" / "lr_check.py"


def _run(algo, seed, lr, curve, status="FINISHED", repeat=None):
    """A run of preset ``algo`` as the trainer tags it; ``repeat``: a (step, value) logged again."""
    points = [[10 * i, 0, v / 100] for i, v in enumerate(curve)]  # [step, timestamp, value]
    if repeat:
        points.append([repeat[0], 1, repeat[1] / 100])
    tags = {
        "algo": algo,
        "components_off": ",".join(PRESETS.get(algo).off()) or "none",
        "seed": str(seed),
    }
    return {
        "run_id": f"{algo}{seed}{lr}",
        "run_name": f"{algo}-s{seed}-abc",
        "status": status,
        "tags": tags,
        "start_time": 0,
        "end_time": 1,
        "params": {"seed": str(seed), "trainer.actor_lr": lr},
        "metrics": {"eval/avg_at_16": points},
    }


def _printed(tmp_path, runs, capsys) -> list[str]:
    """The lines lr_check.py prints for ``runs``, written as a runs file."""
    path = tmp_path / "runs.json.gz"
    write_export(path, "lr-check", runs)
    spec = importlib.util.spec_from_file_location("lr_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([str(path)])
    return capsys.readouterr().out.splitlines()


def test_lr_check_by_hand(tmp_path, capsys):
    # plateau (90 + 90) / 2 = 90; speed: 10*(55+65+75+85+90)/50 = 74
    flat = [
        50.0,
        60.0,
        70.0,
        80.0,
        90.0,
        90.0,
    ]
    low = [50.0, 50.0, 50.0, 50.0, 60.0, 80.0]  # plateau 70; speed 10*(50+50+50+55+70)/50 = 55
    runs = [_run(p, s, "2e-05", flat) for p in ("vapo", "dapo") for s in (0, 1, 2)]
    runs += [_run("ppo", s, "2e-05", low) for s in (0, 1, 2)]
    runs += [_run("ppo", s, "4e-05", flat if s else low) for s in (0, 1, 2)]  # (70 + 90 + 90) / 3
    # not counted: seed 3, killed, not one of the three presets
    runs += [
        _run("ppo", 3, "4e-05", flat),
        _run("vapo", 0, "1e-05", low, status="KILLED"),
        _run("grpo", 0, "1e-05", low),
    ]
    out = _printed(tmp_path, runs, capsys)
    assert (
        out[0]
        == "Vanilla PPO lr 2e-05: plateau  70.0 (seeds [0, 1, 2]: 70.0, 70.0, 70.0), speed  55.0, "
        "NOT at a plateau (moves 20.0 over the last 20%, rule 1)"  # 60 at step 40, 80 at 50
    )
    # seed means (60 + 90 + 90) / 3 = 80 at step 40 and (80 + 90 + 90) / 3 = 86.7 at 50
    assert out[1] == (
        "Vanilla PPO lr 4e-05: plateau  83.3 (seeds [0, 1, 2]: 70.0, 90.0, 90.0), speed  67.7, "
        "NOT at a plateau (moves 6.7 over the last 20%, rule 1)"
    )
    assert out[2].endswith("speed  74.0, at a plateau (moves 0.0 over the last 20%, rule 1)")
    assert out[-2:] == [
        "best VAPO (90.0 at 2e-05) - best Vanilla PPO (83.3 at 4e-05) = +6.7: VAPO above Vanilla "
        "PPO does not depend on the step size (not at a plateau: Vanilla PPO at 4e-05)",
        "best VAPO (90.0 at 2e-05) - best DAPO (90.0 at 2e-05) = +0.0: VAPO above DAPO does not "
        "depend on the step size",
    ]
    assert len(out) == 6


def test_a_rival_best_at_another_lr_within_two_points_makes_the_verdict_depend_on_the_step_size(
    tmp_path, capsys
):
    vapo = [50.0, 60.0, 70.0, 80.0, 90.0, 90.0]  # plateau 90
    near = [50.0, 60.0, 70.0, 80.0, 88.5, 88.5]  # plateau 88.5: 1.5 points below, at 4e-5
    far = [50.0, 60.0, 70.0, 80.0, 87.0, 87.0]  # plateau 87: 3 points below, at 4e-5
    runs = [_run("vapo", s, "2e-05", vapo) for s in (0, 1, 2)]
    runs += [_run("ppo", s, "4e-05", far) for s in (0, 1, 2)] + [
        _run("dapo", s, "4e-05", near) for s in (0, 1, 2)
    ]
    runs += [_run(p, s, "2e-05", [50.0] * 6) for p in ("ppo", "dapo") for s in (0, 1, 2)]
    out = _printed(tmp_path, runs, capsys)
    assert out[-2:] == [
        "best VAPO (90.0 at 2e-05) - best Vanilla PPO (87.0 at 4e-05) = +3.0: VAPO above Vanilla "
        "PPO does not depend on the step size",
        "best VAPO (90.0 at 2e-05) - best DAPO (88.5 at 4e-05) = +1.5: VAPO above DAPO depends on "
        "the step size",
    ]


def test_a_step_logged_twice_counts_once_with_its_later_value(tmp_path, capsys):
    # a resumed run logged step 50 again (70 first, then 90): plateau (90 + 90) / 2, not
    # (90 + 70 + 90) / 3
    curve = [50.0, 60.0, 70.0, 80.0, 90.0, 70.0]
    out = _printed(
        tmp_path, [_run("vapo", s, "2e-05", curve, repeat=(50, 90.0)) for s in (0, 1, 2)], capsys
    )
    assert out == [
        "VAPO        lr 2e-05: plateau  90.0 (seeds [0, 1, 2]: 90.0, 90.0, 90.0), speed  74.0, "
        "at a plateau (moves 0.0 over the last 20%, rule 1)"
    ]
