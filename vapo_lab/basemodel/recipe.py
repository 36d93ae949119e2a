"""The pre-training recipe of the embedded default's base policy: the tiny model, noisy addition.

VAPO starts RL from a *base* model that writes a chain of thought but is often wrong; here
:func:`pretrain` trains the tiny Qwen2 (:mod:`vapo_lab.models.tiny`) on arith scratchpads
(:mod:`vapo_lab.tasks.arith`) with deliberate noise (:class:`~vapo_lab.tasks.arith.TraceNoise`):
a systematic bug that is the model's *mode* wherever it applies, so greedy decoding fails and RL
must raise a minority token, plus random slips. :func:`measure_accuracy` measures held-out
accuracy at temperature 1 and greedily; the target is 10-40% and at most 80%. Why this noise,
and what the defaults measure: docs/default-task.md, The base model.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from vapo_lab.models.arch import TINY_ARCH
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arith import ArithTask, TraceNoise

# Part of the cache key: raise it when the recipe changes in a way the config does not show.
RECIPE_VERSION = 2
# Digit-count buckets for the accuracy-by-length report (n digits -> about 3n+3 response tokens).
BUCKETS = ((1, 5), (6, 10), (11, 20), (21, 40), (41, 70), (71, 100))

# The defaults, chosen by measurement on a 2-core CPU machine (docs/default-task.md).
DEFAULTS: dict[str, Any] = {
    # the task: the same generator and defaults as task=arith, so RL sees these very splits
    "task_seed": 0,
    "n_train": 4096,
    "n_eval": 256,
    "min_digits": 1,
    "max_digits": 40,
    "length_exponent": 0.75,
    # the boxed answer's form (ArithTask's readout): plain digits; scale=cpu-long: labelled words
    "readout": "plain",
    # deliberate noise in the traces (vapo_lab.tasks.arith.TraceNoise): at bug_rate 0.7 the bug
    # is the mode and the right step is sampled 30% of the time; slip_rate 0.05 puts the base
    # inside the accuracy target
    "bug_rate": 0.7,
    "slip_rate": 0.05,
    # the bug's family: with a carry in, the writer forgets it whenever x + y >= 9 (the column
    # overflows), about 25% of columns: wide enough to leave RL room
    "bug_sums": list(range(9, 19)),
    # the tiny model (vapo_lab.models.tiny; model.arch.* in the config)
    **TINY_ARCH,
    "rope_theta": 1e6,
    "init_std": 0.1,
    # pre-training: inside a 3-minute budget on 2 cores; batch and lr were chosen against
    # alternatives on the same tokens (docs/benchmarks.md#base-model-builds). seed: init, batch
    # order and noise draws; lr: AdamW's peak, after warmup_steps of linear warmup, decayed on a
    # cosine to min_lr_ratio x lr
    "seed": 0,
    "steps": 800,
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 30,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.01,
    "grad_clip": 1.0,
    # measurement: samples per eval problem at temperature 1 (greedy takes one)
    "eval_samples": 2,
}


def pretrain(model, tokenizer, task: ArithTask, config: dict[str, Any], bar: Any) -> float:
    """Returns the mean loss of the last 50 steps after training ``model`` on noisy traces in place.

    Next-token cross-entropy on response tokens and the final eos (the prompt's digits are
    random). Each step draws fresh noise, so the model learns the noise *rates*, not one noisy
    trace per problem; batches are bucketed by length to cut padding.
    """
    rng = random.Random(f"vapo-lab/base/{config['seed']}")
    noise = TraceNoise(
        bug_rate=config["bug_rate"], slip_rate=config["slip_rate"], bug_sums=config["bug_sums"]
    )
    prompt_ids = [tokenizer(p.prompt).input_ids for p in task.train]
    steps, batch_size = config["steps"], config["batch_size"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config["lr"], betas=(0.9, 0.95), weight_decay=config["weight_decay"]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: _warmup_cosine(s, steps, config["warmup_steps"], config["min_lr_ratio"]),
    )
    task_id = bar.add_task("pre-training base", total=steps, info="") if bar else None
    model.train()
    batches: list[list[int]] = []
    losses: list[float] = []
    tokens, start = 0, time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config["seed"])
        for step in range(steps):
            if not batches:
                batches = _bucketed_batches(rng, len(task.train), batch_size, prompt_ids)
            index = batches.pop()
            responses = [task.trace(task.train[i], rng, noise) for i in index]
            input_ids, labels = _collate(
                [prompt_ids[i] for i in index], tokenizer(responses).input_ids, tokenizer
            )
            loss = _response_loss(model, input_ids, labels, tokenizer.pad_token_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config["grad_clip"])
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            tokens += int((labels != -100).sum())
            if bar:
                rate = tokens / (time.perf_counter() - start)
                bar.update(
                    task_id,
                    advance=1,
                    info=f"loss {sum(losses[-20:]) / len(losses[-20:]):.3f} · {rate:,.0f} tok/s",
                )
    model.eval()
    tail = losses[-50:]
    return sum(tail) / len(tail)


def _response_loss(
    model, input_ids: torch.Tensor, labels: torch.Tensor, pad_id: int
) -> torch.Tensor:
    """Returns the mean next-token cross-entropy over the labelled (response and eos) positions.

    The output layer runs on those positions only: over the prompt and padding its softmax would
    be ~40% of its cost, for logits the loss ignores.
    """
    hidden = model.model(input_ids=input_ids, attention_mask=input_ids != pad_id).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits, targets[keep])


def _warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Returns the lr multiplier: linear warmup to 1, then cosine decay to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _bucketed_batches(
    rng: random.Random, n: int, batch_size: int, prompt_ids: list[list[int]]
) -> list[list[int]]:
    """Returns 8 batches of random problem indices (< n), each of similar length, shuffled."""
    pool = sorted(
        (rng.randrange(n) for _ in range(8 * batch_size)), key=lambda i: len(prompt_ids[i])
    )
    batches = [pool[i : i + batch_size] for i in range(0, len(pool), batch_size)]
    rng.shuffle(batches)
    return batches


def _collate(
    prompts: list[list[int]], responses: list[list[int]], tokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns right-padded (input_ids, labels); labels are -100 on prompt and padding."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [p + r + [eos] for p, r in zip(prompts, responses)]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, (p, row) in enumerate(zip(prompts, rows)):
        input_ids[b, : len(row)] = torch.tensor(row)
        labels[b, len(p) : len(row)] = torch.tensor(row[len(p) :])
    return input_ids, labels


@torch.no_grad()
def sample_modes(
    model,
    tokenizer,
    problems: list[Problem],
    samples: int,
    seed: int,
    bar: Any = None,
    batch_size: int = 64,
) -> Iterator[tuple[str, int, list[int], Tensor]]:
    """Yields (mode, repeats, problem indices, new tokens (B, T)) of every ``model.generate`` call
    a base measurement makes: each batch greedily once and at temperature 1 ``samples`` times.

    Problems are batched by length, so that short ones are not generated as long as long ones;
    the draws are seeded with ``seed`` in torch's global RNG, forked so the caller's is untouched.
    """
    order = sorted(range(len(problems)), key=lambda i: problems[i].meta["n_digits"])
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    task_id = (
        bar.add_task(
            "measuring accuracy", total=len(batches) * (1 + samples), info="", unit="batch"
        )
        if bar
        else None
    )
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for index in batches:
                enc = tokenizer(
                    [problems[i].prompt for i in index], return_tensors="pt", padding=True
                )
                longest = max(problems[i].meta["n_digits"] for i in index)
                for mode, repeats in (("greedy", 1), ("t1", samples)):
                    for _ in range(repeats):
                        # sampling: plain temperature 1 (transformers 5 applies no top-k/top-p
                        # unless asked), the setting of the trainer's avg@k evaluation
                        sampling = (
                            {"do_sample": True, "temperature": 1.0}
                            if mode == "t1"
                            else {"do_sample": False}
                        )
                        out = model.generate(
                            **enc,
                            **sampling,
                            max_new_tokens=3 * longest + 8,
                            pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id,
                        )
                        yield mode, repeats, index, out[:, enc.input_ids.shape[1] :]
                        if bar:
                            bar.update(task_id, advance=1)
    finally:
        tokenizer.padding_side = padding_side


def measure_accuracy(
    model,
    tokenizer,
    task: ArithTask,
    problems: list[Problem],
    samples: int,
    seed: int,
    bar: Any = None,
    batch_size: int = 64,
) -> dict[str, dict[str, float]]:
    """Returns accuracy ("greedy" and "t1", temperature 1 over ``samples`` draws) by digit bucket,
    from :func:`sample_modes`'s responses."""
    correct = {"greedy": [0.0] * len(problems), "t1": [0.0] * len(problems)}
    draws = sample_modes(model, tokenizer, problems, samples, seed, bar, batch_size)
    for mode, repeats, index, new in draws:
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        for i, text in zip(index, texts):
            correct[mode][i] += task.verify(text, problems[i]) / repeats
    result: dict[str, dict[str, float]] = {}
    for mode, scores in correct.items():
        result[mode] = {"all": round(sum(scores) / max(1, len(scores)), 4)}
        for lo, hi in BUCKETS:
            bucket = [s for s, p in zip(scores, problems) if lo <= p.meta["n_digits"] <= hi]
            if bucket:
                result[mode][f"{lo}-{hi}"] = round(sum(bucket) / len(bucket), 4)
    return result
