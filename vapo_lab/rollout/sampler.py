"""The built-in batched sampler: prompts in, n samples each, token ids, log-probs and masks out.

One prefill per prompt fanned out to its n samples; finished rows leave the batch. Every random
draw comes from one ``torch.Generator`` (deterministic for a seed on CPU); on a GPU from a device
generator seeded from it once a call. Log-probs are of the sampled token under the
temperature-scaled distribution, before top-p: PPO's ratio needs those.

The loop reads nothing back from the device between its checks for finished rows, every
``check_every`` tokens (on a GPU each read waits for the queued kernels: a decoding step of a
small model is bound by the host otherwise); rows that finished in between are decoded on and
their draws dropped. On CPU a read costs nothing, so it checks every token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vapo_lab.rollout.decoder import make_decoder


@dataclass
class Samples:
    """Sampled responses, right-padded; prompts left-padded. B = prompts x n."""

    prompt_ids: Tensor  # (B, P) left-padded with pad_id
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (B, T) right-padded with pad_id (eos included when emitted)
    response_mask: Tensor  # (B, T) bool prefix mask
    logprobs: Tensor  # (B, T) float32, 0 at padding
    lengths: Tensor  # (B,) long: response tokens, eos included
    finished: Tensor  # (B,) bool: ended with eos (False: truncated at max_new_tokens)
    prompt_index: Tensor  # (B,) long: which prompt each row answers (rows of one prompt adjacent)

    @staticmethod
    def empty() -> Samples:
        """Returns no samples (a rank with no prompts: it still takes part in the call)."""
        ids, flags = torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.bool)
        none = torch.zeros(0, dtype=torch.long)
        return Samples(ids, flags, ids, flags, torch.zeros(0, 0), none, none.bool(), none)

    @property
    def truncated(self) -> Tensor:
        """Returns (B,) bool: responses cut at max_new_tokens without an eos."""
        return ~self.finished

    def cpu(self) -> Samples:
        """Returns the samples in host memory, where they are scored and batched (themselves
        there)."""
        if self.response_ids.device.type == "cpu":
            return self
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).cpu() for f in dataclasses.fields(self)}
        )


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Returns logits with everything outside the smallest set of mass >= top_p set to -inf."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    # drop a token when the mass before it already reaches top_p (the first token always stays)
    drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


@torch.no_grad()
def sample(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    n: int = 1,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int | Sequence[int] = 0,
    pad_id: int = 0,
    generator: torch.Generator | None = None,
    fast: bool = True,
    max_batch: int = 256,
    check_every: int | None = None,
    dtype: torch.dtype | None = None,
    graphs: bool = True,
) -> Samples:
    """Returns n samples for each prompt (token id lists), sampled with a KV cache.

    Args:
        model: a causal LM (HF interface); Qwen2/Llama models take the fast decoder.
        prompts: token ids of each prompt (no padding).
        n: samples per prompt; the rows of one prompt are adjacent in the output.
        max_new_tokens: responses stop here if no eos came first (they are then "truncated").
        temperature: logits are divided by it; 0 means greedy (argmax) decoding.
        top_p: nucleus sampling mass in (0, 1].
        eos_id: token id(s) that end a response (kept as its last token).
        pad_id: id used for padding.
        generator: source of randomness (seed it for determinism).
        fast: use the fast decoder when the model supports it.
        max_batch: at most this many rows decoded at once (prompts are chunked).
        check_every: tokens between the loop's reads of the device (finished rows, compaction);
            None: 1 on CPU, ``GPU_CHECK_EVERY`` on a GPU.
        dtype: the fast decoder's compute and KV-cache dtype; None: the model's on CPU, bfloat16
            on a GPU (a replica of the weights in it).
        graphs: on a GPU, replay the fast decoder's step as a CUDA graph (``rollout.cuda_graphs``;
            no effect on CPU).
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 is greedy decoding)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if check_every is not None and check_every < 1:
        raise ValueError(f"check_every={check_every} must be >= 1")
    if not prompts:
        return Samples.empty()
    eos = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id))
    device = next(model.parameters()).device
    on_gpu = device.type != "cpu"
    check_every = check_every or (GPU_CHECK_EVERY if on_gpu else 1)
    dtype = dtype or sampling_dtype(device, next(model.parameters()).dtype)
    generator = device_generator(generator, device)
    per_chunk = max(1, max_batch // n)
    parts = [
        _sample_chunk(
            model,
            prompts[i : i + per_chunk],
            n,
            max_new_tokens,
            temperature,
            top_p,
            eos,
            pad_id,
            generator,
            fast,
            offset=i,
            check_every=check_every,
            dtype=dtype,
            graphs=graphs,
        )
        for i in range(0, len(prompts), per_chunk)
    ]
    return _concat(parts, pad_id)


def _sample_chunk(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    n: int,
    max_new: int,
    temperature: float,
    top_p: float,
    eos: Tensor,
    pad_id: int,
    generator: torch.Generator | None,
    fast: bool,
    offset: int,
    check_every: int = 1,
    dtype: torch.dtype | None = None,
    graphs: bool = False,
) -> Samples:
    device = next(model.parameters()).device
    eos = eos.to(device)
    n_prompts = len(prompts)
    width = max(len(p) for p in prompts)
    prompt_ids = torch.full((n_prompts, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(n_prompts, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        if len(p):
            prompt_ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            prompt_mask[i, width - len(p) :] = True
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)

    rows = n_prompts * n
    decoder = make_decoder(model, n_prompts, width + max_new, fast=fast, dtype=dtype, graphs=graphs)
    logits = decoder.prefill(prompt_ids, prompt_mask)
    if n > 1:
        decoder.repeat(n)
        logits = logits.repeat_interleave(n, dim=0)

    out_ids = torch.full((rows, max_new), pad_id, dtype=torch.long, device=device)
    out_logp = torch.zeros(rows, max_new, dtype=torch.float32, device=device)
    lengths = torch.full((rows,), max_new, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    alive = torch.arange(rows, device=device)  # global row of each decoder row
    running = torch.ones(rows, dtype=torch.bool, device=device)  # decoder rows still generating
    pad = torch.tensor(pad_id, device=device)
    for t in range(max_new):
        token, logp = _draw(logits, temperature, top_p, generator)
        # rows that finished since the last check are still in the batch: keep what they wrote
        out_ids[alive, t] = torch.where(running, token, pad)
        out_logp[alive, t] = torch.where(running, logp, 0.0)
        done = running & torch.isin(token, eos)
        finished[alive] |= done
        lengths[alive] = torch.where(done, t + 1, lengths[alive])
        running &= ~done
        if (t + 1) % check_every == 0 or t + 1 == max_new:  # the loop's only device reads
            n_live = int(running.sum())
            if n_live == 0:
                break
            # drop finished rows from the cache once they are a quarter of the batch: copying
            # the cache at every single finish would cost more than decoding a few dead rows
            if running.numel() - n_live >= max(1, running.numel() // 4):
                keep = running.nonzero().squeeze(-1)
                decoder.select(keep)
                alive, token, running = alive[keep], token[keep], running[keep]
        if t + 1 < max_new:
            logits = decoder.step(token)

    response_mask = torch.arange(max_new, device=device)[None, :] < lengths[:, None]
    out_ids = out_ids.masked_fill(~response_mask, pad_id)
    out_logp = out_logp.masked_fill(~response_mask, 0.0)
    used = int(lengths.max().item()) if rows else 0
    index = torch.arange(n_prompts, device=device).repeat_interleave(n) + offset
    return Samples(
        prompt_ids=prompt_ids.repeat_interleave(n, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
        response_ids=out_ids[:, :used],
        response_mask=response_mask[:, :used],
        logprobs=out_logp[:, :used],
        lengths=lengths,
        finished=finished,
        prompt_index=index,
    )


GPU_CHECK_EVERY = 16  # tokens between a GPU loop's reads of the device


def sampling_dtype(device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """Returns the dtype the fast decoder samples in by default: bfloat16 on a GPU (a replica where
    the model holds float32 masters: decoding reads every weight each token), the model's on
    CPU (where bfloat16 matmuls have no fast kernel without AVX-512)."""
    return torch.bfloat16 if device.type != "cpu" else model_dtype


def device_generator(
    generator: torch.Generator | None, device: torch.device
) -> torch.Generator | None:
    """Returns the generator the draws on ``device`` use: ``generator`` itself on CPU (a seed gives
    the same samples as ever), on a GPU a device generator seeded from one draw of it, so that
    the per-token draws need no host-to-device copy and a run stays reproducible for its seed."""
    if device.type == "cpu" or generator is None or generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def _draw(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Returns (tokens, their log-probs under the temperature-scaled distribution); T = 0 is
    greedy."""
    if temperature == 0:
        logp_all = logits.float().log_softmax(-1)
        token = logp_all.argmax(-1)
    else:
        scaled = logits.float() / temperature
        logp_all = scaled.log_softmax(-1)
        token = _sample_top_p(scaled, top_p, generator)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1)


def _sample_top_p(scaled: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """Returns one token per row drawn from softmax(scaled) restricted to its top-p nucleus.

    The same distribution as ``softmax(top_p_filter(scaled, top_p))``, without sorting the
    vocabulary: a token is drawn from the full distribution and kept when it lies in the nucleus,
    i.e. when the tokens strictly more probable than it hold less than ``top_p`` of the mass;
    rows whose draw falls outside are drawn again. Rejection sampling from p restricted to the
    nucleus N yields exactly p / p(N) on N, and each round accepts with probability p(N) >= top_p,
    so a row needs 1 / p(N) <= 1 / top_p rounds on average, each far cheaper than sorting the
    vocabulary, which took half of a decoding step on CPU (docs/benchmarks.md#generation). (Tokens
    tied in probability at the nucleus edge are kept together, where a sort would keep some of
    them: a difference only for exactly equal logits.) On a GPU the nucleus is cut by a sort
    instead (``top_p_filter``): the rounds' acceptance test would read the device every token.
    """
    probs = scaled.softmax(-1)
    if top_p >= 1.0:
        return inverse_cdf_draw(probs, generator)
    if probs.device.type != "cpu":  # no rejection rounds: their test is a read of the device
        return inverse_cdf_draw(top_p_filter(scaled, top_p).softmax(-1), generator)
    token = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    todo = torch.arange(probs.shape[0], device=probs.device)
    while todo.numel():
        draw = inverse_cdf_draw(probs, generator)
        p_draw = probs.gather(-1, draw[:, None])
        ahead = torch.where(probs > p_draw, probs, 0.0).sum(-1)  # mass strictly more probable
        accept = ahead < top_p
        token[todo[accept]] = draw[accept]
        if bool(accept.all()):
            break
        todo, probs = todo[~accept], probs[~accept]
    return token


def inverse_cdf_draw(weights: Tensor, generator: torch.Generator | None) -> Tensor:
    """Returns one index per row drawn with probability proportional to ``weights`` (B, V), >= 0.

    Inverse-CDF sampling: one uniform per row from ``generator`` (on the generator's device),
    scaled by the row's total and located in its cumulative sum. The same
    distribution as ``torch.multinomial(weights, 1)``, much faster on CPU (multinomial dominated the
    rollout profile: docs/benchmarks.md#generation). A zero-weight index is never drawn: the search
    returns the first index whose cumulative sum exceeds the uniform.
    """
    cdf = weights.float().cumsum(-1)
    where = generator.device if generator is not None else cdf.device
    u = torch.rand(weights.shape[0], 1, generator=generator, device=where).to(cdf.device)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=weights.shape[-1] - 1).squeeze(-1)


def _pad_to(x: Tensor, width: int, value: float | int | bool, left: bool = False) -> Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    fill = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def _concat(parts: list[Samples], pad_id: int) -> Samples:
    if len(parts) == 1:
        return parts[0]
    p = max(s.prompt_ids.shape[1] for s in parts)
    t = max(s.response_ids.shape[1] for s in parts)
    return Samples(
        prompt_ids=torch.cat([_pad_to(s.prompt_ids, p, pad_id, left=True) for s in parts]),
        prompt_mask=torch.cat([_pad_to(s.prompt_mask, p, False, left=True) for s in parts]),
        response_ids=torch.cat([_pad_to(s.response_ids, t, pad_id) for s in parts]),
        response_mask=torch.cat([_pad_to(s.response_mask, t, False) for s in parts]),
        logprobs=torch.cat([_pad_to(s.logprobs, t, 0.0) for s in parts]),
        lengths=torch.cat([s.lengths for s in parts]),
        finished=torch.cat([s.finished for s in parts]),
        prompt_index=torch.cat([s.prompt_index for s in parts]),
    )
