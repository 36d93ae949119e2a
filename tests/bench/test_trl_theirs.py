"""TRL's side of the benchmark: the verifier shaped as PPOTrainer's reward model."""

import torch

from vapo_lab.bench.trl.spec import bench_task
from vapo_lab.bench.trl.theirs import _verifier_reward_model, disable_gc_collect, gc_collect_calls


def test_verifier_reward_model_grades_and_counts_like_ppo_trainer_reads_it(model_dir, small_spec):
    from transformers import AutoTokenizer

    # PPOTrainer reads:
    # score(getattr(m, m.base_model_prefix)(input_ids, attention_mask, ...).hidden_states[-1])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = bench_task(small_spec)
    right, wrong = task.train[0], task.train[1]
    counter = [0]
    model = _verifier_reward_model(tokenizer, task, counter)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [
        tokenizer(p.prompt)["input_ids"] + tokenizer(task.trace(p))["input_ids"] + [eos]
        for p in (right, wrong)
    ]
    rows[1][-3] = tokenizer.convert_tokens_to_ids(
        "0" if rows[1][-3] != tokenizer.convert_tokens_to_ids("0") else "1"
    )
    width = max(map(len, rows)) + 2
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = ids != pad
    hidden = getattr(model, model.base_model_prefix)(
        input_ids=ids.masked_fill(~mask, 0),
        attention_mask=mask,
        position_ids=None,
        return_dict=True,
        output_hidden_states=True,
        use_cache=False,
    ).hidden_states[-1]
    last = mask.sum(-1) - 1
    assert model.score(hidden)[torch.arange(2), last].squeeze(-1).tolist() == [1.0, 0.0]
    prompt_len = [len(tokenizer(p.prompt)["input_ids"]) for p in (right, wrong)]
    # response tokens, eos included
    assert counter[0] == sum(len(r) - n for r, n in zip(rows, prompt_len))


def test_disable_gc_collect_silences_only_the_trainer_module(tmp_path, monkeypatch):
    import gc
    import importlib.util

    source = tmp_path / "fake_trainer.py"
    source.write_text(
        "import gc\n\ndef step():\n    gc.collect()\n    x = 1\n    gc.collect()\n    return x\n"
    )
    spec = importlib.util.spec_from_file_location("fake_trainer", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    module.step()
    assert len(calls) == 2 and gc_collect_calls(module) == 2  # as shipped: two real collections
    assert disable_gc_collect(module) == 2
    module.step()
    assert len(calls) == 2  # no more collections from the trainer's module ...
    gc.collect()
    assert len(calls) == 3  # ... while the interpreter's collector still works for everyone else
