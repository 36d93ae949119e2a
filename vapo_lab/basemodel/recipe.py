"""The pre-training recipe of the embedded default's base policy: the tiny model taught noisy addition.

VAPO starts RL from Qwen2.5-32B *base*: a model that can write a chain of thought but is often
wrong. The embedded default mirrors that: :func:`pretrain` trains the tiny Qwen2 model
(:mod:`vapo_lab.models.tiny`) with next-token loss on scratchpad traces of the arith train split
(:mod:`vapo_lab.tasks.arith`) that carry deliberate noise (:class:`~vapo_lab.tasks.arith.TraceNoise`):

* a systematic bug, wrong in ``bug_rate`` (> 0.5) of the traces where it applies (``bug_sums``:
  a column with a carry in whose digits x + y >= 9, so that it overflows; the writer forgets the
  carry in, about 25% of columns), so the wrong step is the model's *mode*: greedy decoding fails
  on every problem with such a step, and RL has to raise a minority token, not merely sharpen the
  distribution. Traces with only random slips would be too easy: a base trained on them reached
  35% at temperature 1 but 100% greedily, and RL "won" by removing the slips in 40 steps, so
  that the seven components could not matter.
* random slips at ``slip_rate`` per column, which cost accuracy at temperature 1 only.

Both accumulate over columns, so long problems are harder and their reward sparser (VAPO.md,
challenge 3). :func:`measure_accuracy` measures held-out accuracy at temperature 1 and greedily,
overall and by digit count; the target is 10-40% at temperature 1 and at most 80% greedily. The
build is deterministic on one machine (the same config gives the same weights and figures); the
defaults' accuracies by digit count are in docs/default-task.md#the-base-model.

The 21-40-digit problems are out of the base's reach (their reward is always 0 before RL): its
scratchpad columns are mostly right there too, but reading 21+ unlabelled answer digits back
needs the model to count further than 3 minutes of pre-training teaches it; the read-out drifts.
The 11-20-digit ones nearly always meet the bug (a 15-digit problem has about 4 bug columns), so
they are where RL has the most to gain once short problems have taught it to keep the carry.

The bug's family is wide (every overflowing column) because a narrow one (x + y = 9 only, 4.5% of
columns) leaves RL little room: the default run gains nearly twice as much with the wide family
(docs/default-task.md#the-base-model).

Change :data:`RECIPE_VERSION` whenever the recipe changes in a way the config does not show.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import torch

from vapo_lab.models.arch import TINY_ARCH
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arith import ArithTask, TraceNoise

# Bump when the recipe changes in a way the config does not capture: old caches are then ignored.
RECIPE_VERSION = 2
# Digit-count buckets for the accuracy-by-length report (n digits -> about 3n+3 response tokens).
BUCKETS = ((1, 5), (6, 10), (11, 20), (21, 40), (41, 70), (71, 100))

# The defaults, chosen by measurement on a 2-core CPU machine (see the module docstring).
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
    # deliberate noise in the traces (vapo_lab.tasks.arith.TraceNoise). bug_rate 0.7: the bug is
    # the mode (greedy fails) and the right step is sampled 30% of the time; slip_rate 0.05 puts
    # temperature-1 accuracy at 16.6% and greedy at 24.6% with the bug family below (with the
    # x + y = 9 family: 29.5% / 44.5%; slip_rate 0.02 there gave 48% / 63% with 1/n lengths)
    "bug_rate": 0.7,
    "slip_rate": 0.05,
    # the bug's family: with a carry in, the writer forgets it whenever x + y >= 9 (the column
    # overflows), about 25% of columns: wide enough to leave RL room (see the module docstring)
    "bug_sums": list(range(9, 19)),
    # the tiny model (vapo_lab.models.tiny; model.arch.* in the config)
    **TINY_ARCH,
    "rope_theta": 1e6,
    "init_std": 0.1,
    # pre-training: inside a 3-minute budget on 2 cores; batch and lr were chosen against
    # alternatives on the same tokens (docs/benchmarks.md#base-model-builds)
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

    Loss: next-token cross-entropy on response tokens and the final eos (not the prompt: its
    digits are random). Each step takes ``batch_size`` training problems with fresh noise draws,
    so the model learns the noise *rates*, not one fixed noisy trace per problem. Batches are
    bucketed by length (8 batches' worth sorted together) to cut padding.
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

    The output layer runs on those positions only: over the prompt and padding its 2823-way
    softmax would be ~40% of its cost, for logits the loss ignores.
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
    """Returns 8 batches of random problem indices (< n), each of similar length, in random order."""
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
    """Returns accuracy ("greedy" and "t1", temperature 1 over ``samples`` draws) by digit bucket.

    Uses ``model.generate`` with left padding; problems are batched by length so short ones are
    not padded to (and generated as long as) long ones.
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
    correct = {"greedy": [0.0] * len(problems), "t1": [0.0] * len(problems)}
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
                        texts = tokenizer.batch_decode(
                            out[:, enc.input_ids.shape[1] :], skip_special_tokens=True
                        )
                        for i, text in zip(index, texts):
                            correct[mode][i] += task.verify(text, problems[i]) / repeats
                        if bar:
                            bar.update(task_id, advance=1)
    finally:
        tokenizer.padding_side = padding_side
    result: dict[str, dict[str, float]] = {}
    for mode, scores in correct.items():
        result[mode] = {"all": round(sum(scores) / max(1, len(scores)), 4)}
        for lo, hi in BUCKETS:
            bucket = [s for s, p in zip(scores, problems) if lo <= p.meta["n_digits"] <= hi]
            if bucket:
                result[mode][f"{lo}-{hi}"] = round(sum(bucket) / len(bucket), 4)
    return result
