"""Benchmarks the training passes: packed (``models.packed.packed_states``) against padded.

``vapo-lab bench update`` samples one default training step's batch from the shipped base model,
then times the trainer's update passes over it (forward + backward over each micro-batch; the
actor's log-probs and entropy, the critic's values), packed and padded (Hugging Face's forward),
interleaved repeat by repeat. Both paths get the same micro-batches and weights, and the run
checks that their log-probs, values and gradients agree to float32 rounding. It also reports the
real-token share: a micro-batch's valid tokens over the padded layout's rows x (longest prompt +
longest response) positions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from vapo_lab.errors import ConfigError


@contextmanager
def padded_path():
    """Makes the training passes take Hugging Face's padded forward (the reference) in the block."""
    from vapo_lab.models import packed

    original = packed.shares_prompts
    packed.shares_prompts = lambda decoder: False
    try:
        yield
    finally:
        packed.shares_prompts = original


def step_batch(
    seed: int = 0, overrides: tuple[str, ...] = ()
) -> tuple[Any, Any, list[list[torch.Tensor]]]:
    """Returns (policy, the step's rows, micro-batch indices per mini-batch) of one default step.

    The policy is the config's base model (shipped for the default: no build); the rows are one
    step's rollout, sampled as the trainer samples it; the micro-batches are the trainer's split.
    """
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.models.load import load_model_and_tokenizer
    from vapo_lab.rollout.sampler import sample
    from vapo_lab.trainer.forward import Rows, token_micro_batches
    from vapo_lab.trainer.setup import task_for
    from vapo_lab.trainer.update import minibatches

    cfg = typed(compose_config(overrides=list(overrides)).cfg)
    base = build_base_for(cfg.model, cfg.task, progress=None)
    policy, tokenizer = load_model_and_tokenizer(base.path)
    task = task_for(cfg.task)
    generator = torch.Generator().manual_seed(seed)
    n = cfg.rollout.group_size
    prompts = [
        tokenizer(p.prompt).input_ids for p in task.train[: cfg.rollout.responses_per_step // n]
    ]
    with torch.no_grad():
        s = sample(
            policy.eval(),
            prompts,
            n=n,
            max_new_tokens=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature,
            top_p=1.0,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            generator=generator,
        )
    rows = Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask)
    budget = cfg.trainer.max_tokens_per_micro_batch
    split = [
        token_micro_batches(mb, rows, budget)
        for mb in minibatches(len(s.lengths), cfg.trainer.mini_batch_size, generator)
    ]
    return policy, rows, split


def real_token_share(rows: Any, micro_batches: list[torch.Tensor]) -> float:
    """Returns valid tokens / positions of the padded layout, over the given micro-batches."""
    valid = positions = 0
    for idx in micro_batches:
        r = rows.take(idx)
        valid += int(r.prompt_mask.sum() + r.response_mask.sum())
        positions += r.prompt_ids.numel() + r.response_ids.numel()
    return valid / positions


def _timed(
    module: Any,
    rows: Any,
    split: list[list[torch.Tensor]],
    output: Callable[[Any], torch.Tensor],
    loss: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[float, torch.Tensor]:
    """Runs forward and backward over every micro-batch of ``split``.

    Returns (seconds, the outputs at valid positions, concatenated).
    """
    module.zero_grad(set_to_none=True)
    start = time.perf_counter()
    kept = []
    for micro in split:
        for idx in micro:
            r = rows.take(idx)
            out = output(r)
            loss(out * r.response_mask).mul(1e-3).backward()
            kept.append(out.detach()[r.response_mask])
    return time.perf_counter() - start, torch.cat(kept)


def _passes(model: Any, critic: Any, rows: Any, split: list[list[torch.Tensor]]) -> dict[str, Any]:
    """Runs the actor's and critic's passes; returns their seconds, outputs and gradients."""
    from vapo_lab.trainer.forward import policy_forward, value_forward

    out: dict[str, Any] = {}
    out["actor_s"], out["logprobs"] = _timed(
        model,
        rows,
        split,
        lambda r: policy_forward(model, r, 1.0, with_entropy=True)[0],
        lambda x: x.sum(),
    )
    out["critic_s"], out["values"] = _timed(
        critic, rows, split, lambda r: value_forward(critic, r), lambda x: x.square().sum()
    )
    out["grads"] = torch.cat(
        [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        + [p.grad.flatten() for p in critic.parameters() if p.grad is not None]
    )
    return out


def run_update_benchmark(
    repeats: int = 7,
    seed: int = 0,
    threads: int | None = None,
    log: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Times packed and padded training passes over one default step, ``repeats`` interleaved.

    Returns {"share_padded", "tokens", "rows", "packed": {actor_s, critic_s lists}, "padded": ...,
    "max_abs_diff": {logprobs, values, grads}}.
    """
    from vapo_lab.models.value import ValueModel

    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: need at least 1")
    if threads is not None:
        torch.set_num_threads(threads)
    policy, rows, split = step_batch(seed)
    policy.train()
    torch.manual_seed(seed)
    critic = ValueModel.from_causal_lm(policy).train()
    torch.nn.init.normal_(critic.head.weight, std=0.1)
    micros = [idx for micro in split for idx in micro]
    result: dict[str, Any] = {
        "share_padded": real_token_share(rows, micros),
        "rows": len(rows.response_ids),
        "tokens": int(rows.prompt_mask.sum() + rows.response_mask.sum()),
        "response_tokens": int(rows.response_mask.sum()),
        "micro_batches": len(micros),
        "packed": {"actor_s": [], "critic_s": []},
        "padded": {"actor_s": [], "critic_s": []},
    }
    last: dict[str, Any] = {}
    for i in range(repeats + 1):  # the first round is a warm-up
        for name in ("packed", "padded") if i % 2 else ("padded", "packed"):
            if name == "padded":
                with padded_path():
                    out = _passes(policy, critic, rows, split)
            else:
                out = _passes(policy, critic, rows, split)
            last[name] = out
            if i:
                result[name]["actor_s"].append(out["actor_s"])
                result[name]["critic_s"].append(out["critic_s"])
        if i:
            log(
                f"repeat {i}/{repeats}: "
                + ", ".join(
                    f"{n} actor {result[n]['actor_s'][-1]:.2f}s "
                    f"critic {result[n]['critic_s'][-1]:.2f}s"
                    for n in ("padded", "packed")
                )
            )
    result["max_abs_diff"] = {
        k: float((last["packed"][k] - last["padded"][k]).abs().max())
        for k in ("logprobs", "values", "grads")
    }
    result["max_abs"] = {
        k: float(last["padded"][k].abs().max()) for k in ("logprobs", "values", "grads")
    }
    return result


def format_update_benchmark(result: dict[str, Any]) -> str:
    """Returns ``run_update_benchmark``'s report: timings, ratios with their spread, the share."""

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    lines = [
        f"training passes over one default step: {result['rows']} responses, "
        f"{result['tokens']} valid tokens "
        f"({result['response_tokens']} in responses), {result['micro_batches']} micro-batches; "
        f"torch threads {torch.get_num_threads()}",
        f"real-token share of the padded layout: {100 * result['share_padded']:.1f}% "
        "(packed: every token-wise op sees valid tokens only; attention keeps the padded layout)",
        "",
        f"{'pass':<8} {'padded s':>9} {'packed s':>9} {'ratio (median)':>15} {'ratio range':>14}",
    ]
    for part in ("actor_s", "critic_s"):
        a, b = result["padded"][part], result["packed"][part]
        ratios = [x / y for x, y in zip(a, b)]
        lines.append(
            f"{part[:-2]:<8} {med(a):>9.3f} {med(b):>9.3f} {med(ratios):>14.2f}x "
            f"{min(ratios):>6.2f}-{max(ratios):.2f}x"
        )
    lines += [
        "",
        "ratio: padded seconds / packed seconds of the same repeat "
        "(interleaved, order alternating); "
        f"median and range over {len(result['packed']['actor_s'])} repeats after one warm-up.",
        "max |packed - padded|: "
        + ", ".join(
            f"{k} {v:.1e} (of |{k}| up to {result['max_abs'][k]:.1e})"
            for k, v in result["max_abs_diff"].items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_update_benchmark(run_update_benchmark(log=print)))
