"""task=math reads DAPO-Math-17k as it ships (Parquet, chat prompt and ground truth nested) and
plain Parquet or JSONL with the keys set; bad files are refused in one line naming them."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vapo_lab.errors import ConfigError
from vapo_lab.tasks.math import MathTask, load_jsonl

# three rows in DAPO-Math-17k's layout (its columns and nesting, the texts made up here)
DAPO_ROWS = [
    {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": f"Solve {i} + {i}. Answer: $Answer"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(2 * i), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"idx-{i}"},
    }
    for i in range(1, 4)
]


def test_dapo_math_parquet_as_it_ships(tmp_path):
    path = tmp_path / "dapo-math-17k.parquet"
    pq.write_table(pa.Table.from_pylist(DAPO_ROWS), path)
    problems = load_jsonl(path)
    assert [p.prompt for p in problems] == [f"Solve {i} + {i}. Answer: $Answer" for i in (1, 2, 3)]
    assert [p.answer for p in problems] == ["2", "4", "6"]
    assert [p.meta["line"] for p in problems] == [1, 2, 3]  # row numbers, from 1


def test_the_same_rows_as_parquet_and_as_jsonl_give_the_same_task(tmp_path):
    rows = [{"question": f"{i} * 3 = ?", "target": str(3 * i)} for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kw = dict(seed=0, n_train=0, n_eval=2, problem_key="question", answer_key="target")
    a = MathTask(train_path=str(tmp_path / "t.parquet"), **kw)
    b = MathTask(train_path=str(tmp_path / "t.jsonl"), **kw)
    assert [(p.prompt, p.answer) for p in a.train] == [(p.prompt, p.answer) for p in b.train]
    assert [p.answer for p in a.eval] == ["24", "27"]  # the last n_eval rows are held out


def test_a_row_without_the_keys_names_its_row(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"problem": "1+1", "answer": "2"}, {"problem": "x"}]), path
    )
    with pytest.raises(ConfigError, match=r"t.parquet:2: no 'problem' text or no 'answer' value"):
        load_jsonl(path)


def test_a_file_that_is_not_parquet_is_one_line(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_text('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"t.parquet: not a Parquet file pyarrow can read") as e:
        load_jsonl(path)
    assert "\n" not in str(e.value)
