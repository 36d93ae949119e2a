"""The benchmark's step settings and task, the same on every side."""

from vapo_lab.bench.trl.spec import BenchSpec, bench_task


def test_bench_prompts_have_one_length():
    task = bench_task(BenchSpec())
    assert {len(p.prompt.split()) for p in task.train} == {22}  # 10 x-words, +, 10 y-words, =
