"""The held-out evaluation spread over the ranks by (problem, sample): with more ranks than
problems every rank samples, and the gathered avg@k, pass@k and mean length are those of all
P x k responses, each problem's k verdicts together."""

import json
from pathlib import Path

from vapo_lab.eval.metrics import avg_at_k, pass_at_k_table

from .conftest import torchrun

SCRIPT = Path(__file__).with_name("rank_eval_spread.py")


def test_three_ranks_share_two_problems_and_gather_every_verdict(tmp_path):
    # held-out problems 3 and 5 of the embedded default (the shipped base model solves about 3 in
    # 8 of the first, none of the second), k = 4: 8 pairs on 3 ranks, 3 + 3 + 2. Rank 0: problem
    # 0 x 3 (one prompt, n = 3); rank 1: problem 0 x 1 and problem 1 x 2 (gcd 1: prompts
    # [0, 1, 1], n = 1); rank 2: problem 1 x 2. Split by problem, as before, ceil(2 / 3) = 1
    # problem a rank: rank 2 sampled nothing
    torchrun(3, SCRIPT, str(tmp_path), "3,5", "4", timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert [r["calls"] for r in ranks] == [[[1, 3]], [[3, 1]], [[1, 2]]]
    assert [[row[0] for row in r["rows"]] for r in ranks] == [[0, 0, 0], [0, 1, 1], [1, 1]]
    rows = [row for r in ranks for row in r["rows"]]
    per_problem = [[ok for p, ok, _ in rows if p == i] for i in (0, 1)]
    lengths = [n for _, _, n in rows]
    want = {
        "eval/avg_at_4": avg_at_k(per_problem),
        "eval/pass_at_4": pass_at_k_table(per_problem)[4],
        "eval/response_length": sum(lengths) / 8,
        "eval/truncated_frac": 0.0,
    }
    for r in ranks:  # every rank has the whole result
        assert r["metrics"].keys() == want.keys()
        for key, value in want.items():
            assert abs(r["metrics"][key] - value) < 1e-6, (key, r["metrics"][key], value)
    # on the machine this was written on: problem 0 [T, F, T, T], problem 1 all wrong, so rows
    # that mixed the two problems' verdicts would have shown in pass@4 (0.5)
