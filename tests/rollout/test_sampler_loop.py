"""The built-in sampler's loop (issue 48): the tokens of the per-token loop it replaced, reads of
the device only every ``check_every`` tokens, bfloat16 sampling within tolerance of float32, SDPA
as the matmul attention, and the empty prompt."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.rollout.test_sampler import VOCAB, _qwen
from vapo_lab.rollout.decoder import FastDecoder, HFDecoder, make_decoder
from vapo_lab.rollout.sampler import Samples, _draw, device_generator, sample

PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]


@torch.no_grad()
def _reference(model, prompts, n, max_new, temperature, top_p, eos, generator):
    """The loop before issue 48, written plainly: one prompt chunk, every token's finished rows
    read back at once and dropped once they are a quarter of the batch (a slow reference)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), True
    decoder = make_decoder(model, len(prompts), width + max_new)
    logits = decoder.prefill(ids, mask).repeat_interleave(n, dim=0)
    decoder.repeat(n)
    rows = len(prompts) * n
    out = [[] for _ in range(rows)]
    logps = [[] for _ in range(rows)]
    alive = list(range(rows))
    running = [True] * rows
    for t in range(max_new):
        token, logp = _draw(logits, temperature, top_p, generator)
        for j, row in enumerate(alive):
            if running[j]:
                out[row].append(int(token[j]))
                logps[row].append(float(logp[j]))
                if int(token[j]) in eos:
                    running[j] = False
        if not any(running):
            break
        if len(running) - sum(running) >= max(1, len(running) // 4):
            keep = [j for j, r in enumerate(running) if r]
            decoder.select(torch.tensor(keep))
            alive = [alive[j] for j in keep]
            running = [True] * len(keep)
            token = token[torch.tensor(keep)]
        if t + 1 < max_new:
            logits = decoder.step(token)
    return out, logps


def test_every_token_checked_the_loop_gives_the_tokens_of_the_per_token_reference():
    model = _qwen()
    for temperature, top_p in ((1.0, 1.0), (0.8, 0.9)):
        g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        s = sample(
            model, PROMPTS, n=4, max_new_tokens=20, temperature=temperature, top_p=top_p,
            eos_id=[1, 2], pad_id=0, generator=g1, check_every=1,
        )  # fmt: skip
        ids, logps = _reference(model, PROMPTS, 4, 20, temperature, top_p, [1, 2], g2)
        assert s.finished.any() and not s.finished.all()  # both kinds of row are exercised
        for b in range(len(ids)):
            n = int(s.lengths[b])
            assert s.response_ids[b, :n].tolist() == ids[b]
            assert s.logprobs[b, :n].tolist() == logps[b]


class DeviceReads(TorchFunctionMode):
    """Counts the calls that copy a tensor's value to the host: on a GPU each one waits for every
    kernel queued before it."""

    READS = {
        torch.Tensor.item,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__index__,
        torch.Tensor.__float__,
        torch.Tensor.tolist,
        torch.Tensor.nonzero,
        torch.nonzero,
    }

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _reads(check_every, max_new=48):
    model = _qwen()
    g = torch.Generator().manual_seed(3)
    with DeviceReads() as reads:
        s = sample(
            model, PROMPTS, n=4, max_new_tokens=max_new, eos_id=[-1], pad_id=0, generator=g,
            check_every=check_every,
        )  # fmt: skip
    assert int(s.lengths.min()) == max_new  # no eos: every row runs to the end
    return reads.count


def test_the_loop_reads_the_device_once_every_check_every_tokens_not_every_token():
    # 48 tokens, no row ends: checking every 8 tokens reads the device at 6 checks (plus a few
    # reads outside the loop: the layout's widths); checking every token reads it at all 48
    every_8, every_1 = _reads(8), _reads(1)
    assert every_1 >= 48
    assert every_8 <= 48 // 8 + 4


def test_rows_that_finish_between_checks_keep_what_they_wrote():
    model = _qwen()
    for check_every in (3, 16):
        s = sample(
            model, PROMPTS, n=4, max_new_tokens=24, eos_id=[1, 2], pad_id=0,
            generator=torch.Generator().manual_seed(11), check_every=check_every,
        )  # fmt: skip
        assert s.finished.any()
        for b in range(s.response_ids.shape[0]):
            n = int(s.lengths[b])
            assert s.response_mask[b].sum() == n and (s.response_ids[b, n:] == 0).all()
            tokens = s.response_ids[b, :n].tolist()
            if s.finished[b]:  # ends at its first eos, nothing written after it
                assert tokens[-1] in (1, 2) and not set(tokens[:-1]) & {1, 2}
            else:
                assert n == 24 and not set(tokens) & {1, 2}
            # the log-probs are the model's own for those tokens (temperature 1)
            prompt = s.prompt_ids[b][s.prompt_mask[b]]
            with torch.no_grad():
                logits = model(input_ids=torch.cat([prompt, s.response_ids[b, :n]])[None]).logits
            ref = logits[0].log_softmax(-1)[len(prompt) - 1 : len(prompt) - 1 + n]
            ref = ref.gather(-1, s.response_ids[b, :n, None]).squeeze(-1)
            torch.testing.assert_close(s.logprobs[b, :n], ref, atol=1e-5, rtol=0)


def _next_token_probs(model, dtype, steps=4):
    """The decoder's next-token distributions after a prompt and ``steps`` fixed tokens."""
    ids = torch.tensor([[5, 6, 7, 8]])
    d = FastDecoder(model, 1, 16, dtype=dtype)
    with torch.no_grad():
        out = [d.prefill(ids, torch.ones_like(ids, dtype=torch.bool))]
        out += [d.step(torch.tensor([t])) for t in (9, 10, 11, 12)[:steps]]
    return [o.float().softmax(-1)[0] for o in out]


def test_bfloat16_sampling_stays_within_tolerance_of_float32():
    model = _qwen()
    for p32, p16 in zip(_next_token_probs(model, None), _next_token_probs(model, torch.bfloat16)):
        assert 0.5 * (p32 - p16).abs().sum() < 0.02  # total variation of each next-token law
    # 20,000 first tokens drawn in bfloat16 against the float32 probabilities
    s = sample(
        model, [[5, 6, 7, 8]], n=20000, max_new_tokens=1, eos_id=[-1], pad_id=0,
        generator=torch.Generator().manual_seed(0), dtype=torch.bfloat16, max_batch=20000,
    )  # fmt: skip
    counts = torch.bincount(s.response_ids[:, 0], minlength=VOCAB).float() / 20000
    p32 = _next_token_probs(model, None, steps=0)[0]
    # sampling noise alone: E[TV] ≈ Σ sqrt(p(1-p) / 20000) / sqrt(2π) ≈ 0.01 over 40 tokens
    assert 0.5 * (counts - p32).abs().sum() < 0.04
    assert s.logprobs.dtype == torch.float32


def test_sdpa_attention_gives_the_matmul_attentions_logits():
    model = _qwen()
    torch.manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 6))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False
    mask[2, :5] = False
    ids[~mask] = 0
    new = torch.randint(3, VOCAB, (3, 4))
    with torch.no_grad():
        a, b = FastDecoder(model, 3, 16), FastDecoder(model, 3, 16, attention="sdpa")
        torch.testing.assert_close(a.prefill(ids, mask), b.prefill(ids, mask), atol=1e-5, rtol=0)
        for j in range(4):
            torch.testing.assert_close(a.step(new[:, j]), b.step(new[:, j]), atol=1e-5, rtol=0)


def _attention_by_hand(q, k, v, mask, scale):
    """Grouped-query attention written plainly: each query head h attends with KV head h // g."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    return (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v.double()).float()


@pytest.mark.parametrize("heads,kv", [(4, 4), (4, 2), (8, 2), (14, 2), (12, 1)])
@pytest.mark.parametrize("s", [1, 5])
def test_grouped_sdpa_gives_enable_gqa_s_attention(heads, kv, s):
    """Query groups folded into the query length: what SDPA's enable_gqa gives, and attention
    written by hand, for a decode step's (B, 1, 1, T) mask and a prompt block's (B, 1, S, T)."""
    from vapo_lab.rollout.decoder import grouped_sdpa

    torch.manual_seed(heads * 10 + kv + s)
    b, t, d = 3, 9, 16
    q = torch.randn(b, heads, s, d)
    k, v = torch.randn(b, kv, t, d), torch.randn(b, kv, t, d)
    mask = torch.rand(b, 1, s, t) < 0.6
    mask[..., -1] = True  # no fully masked row (SDPA's kernels differ on those)
    scale = d**-0.5
    got = grouped_sdpa(q, k, v, mask, scale)
    gqa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    assert got.shape == (b, heads, s, d)
    torch.testing.assert_close(got, gqa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, _attention_by_hand(q, k, v, mask, scale), atol=1e-5, rtol=1e-5)


def test_the_sdpa_decoder_folds_query_groups_and_never_asks_for_enable_gqa(monkeypatch):
    """The decoder's SDPA calls see as many query heads as KV heads and no enable_gqa (which, with
    a mask, only the math kernel takes: the whole cache repeated in float32 every layer)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape[1], k.shape[1], bool(kwargs.get("enable_gqa", False))))
        return sdpa(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = _qwen()  # 4 query heads over 2 KV heads
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])
    with torch.no_grad():
        for static in (False, True):
            d = FastDecoder(model, 2, 8, attention="sdpa", static=static)
            d.prefill(ids, ids != 0)
            d.step(torch.tensor([10, 11]))
    assert len(calls) == 2 * 2 * 2  # layers x (prefill, step) x (dynamic, static)
    assert calls == [(2, 2, False)] * len(calls)


def test_an_empty_prompt_is_sampled_like_any_other_and_no_prompts_give_no_samples():
    model = _qwen()
    runs = [
        sample(
            model,
            [[], [5, 6]],
            n=2,
            max_new_tokens=6,
            eos_id=[1, 2],
            pad_id=0,
            generator=torch.Generator().manual_seed(2),
            fast=fast,
            check_every=4,
        )  # fmt: skip
        for fast in (True, False)
    ]
    assert runs[0].response_ids.shape[0] == 4 and not runs[0].prompt_mask[:2].any()
    assert torch.isfinite(runs[0].logprobs).all()
    assert torch.equal(runs[0].response_ids, runs[1].response_ids)
    assert (
        sample(model, [], n=3, check_every=4).response_ids.shape
        == Samples.empty().response_ids.shape
    )


def test_a_cpu_run_draws_on_its_own_generator():
    g = torch.Generator().manual_seed(0)
    assert device_generator(g, torch.device("cpu")) is g
    assert device_generator(None, torch.device("cpu")) is None
    assert isinstance(make_decoder(_qwen(), 1, 8, fast=False), HFDecoder)


def test_a_gpu_samples_in_bfloat16_and_the_trainer_then_recomputes_ppos_old_logprobs():
    from types import SimpleNamespace

    from vapo_lab.config.schema import TrainerConfig
    from vapo_lab.distributed.world import single
    from vapo_lab.rollout.sampler import sampling_dtype
    from vapo_lab.trainer.collect import Sampling
    from vapo_lab.trainer.forward import Rows
    from vapo_lab.trainer.phases import Phases

    assert sampling_dtype(torch.device("cpu"), torch.float32) == torch.float32
    assert sampling_dtype(torch.device("cuda"), torch.float32) == torch.bfloat16
    model = _qwen()
    s = sample(model, PROMPTS, n=2, max_new_tokens=5, eos_id=[1, 2], pad_id=0)
    rows = Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask)
    for recompute in (False, True):
        batch = SimpleNamespace(
            problems=list(range(len(s.lengths))),
            rows=rows,
            old_logprobs=torch.zeros_like(s.logprobs),
        )
        parts = SimpleNamespace(world=single(), sampling=Sampling(None, None, 0, None, recompute))
        Phases(parts, TrainerConfig(), 1.0).model_outputs(batch, policy=model)
        # recomputed: the policy's own log-probs of the sampled tokens (here the sampler's too)
        expected = s.logprobs if recompute else torch.zeros_like(s.logprobs)
        torch.testing.assert_close(
            batch.old_logprobs * s.response_mask, expected, atol=1e-5, rtol=0
        )


# ---- the static decode step: the body of the CUDA graph (rollout.cuda_graphs) ------------------


def test_the_static_step_gives_the_dynamic_step_s_logits():
    """Fixed shapes (the whole cache attended, unwritten slots masked), the slot a device tensor:
    the same logits as the step over the written prefix, through repeat and compaction."""
    model = _qwen()
    torch.manual_seed(4)
    ids = torch.randint(3, VOCAB, (3, 5))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False
    ids[~mask] = 0
    new = torch.randint(3, VOCAB, (6, 8))
    for attention in ("matmul", "sdpa"):
        with torch.no_grad():
            a = FastDecoder(model, 3, 16, attention=attention)
            b = FastDecoder(model, 3, 16, attention=attention, static=True)
            torch.testing.assert_close(a.prefill(ids, mask), b.prefill(ids, mask))
            a.repeat(2), b.repeat(2)
            for j in range(8):
                tokens = new[: a.k.shape[1], j]
                torch.testing.assert_close(a.step(tokens), b.step(tokens), atol=1e-5, rtol=0)
                if j == 3:  # compaction: rows 0, 2, 5 go on
                    keep = torch.tensor([0, 2, 5])
                    a.select(keep), b.select(keep)
            assert a.length == b.length == 13 and int(b._t) == 13
            with pytest.raises(ValueError, match="cache of 16 tokens is full"):
                for _ in range(4):
                    b.step(new[:3, 0])


def test_the_static_step_reads_nothing_back_from_the_device():
    model = _qwen()
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])
    d = FastDecoder(model, 2, 24, static=True)
    with torch.no_grad():
        d.prefill(ids, ids != 0)
        with DeviceReads() as reads:
            for t in range(10):
                d.step(torch.tensor([10 + t, 20 + t]))
    assert reads.count == 0  # a read would stop a CUDA graph's capture


def test_the_sampler_with_the_static_step_samples_the_same_tokens(monkeypatch):
    from vapo_lab.rollout import sampler as sampler_module

    model = _qwen()

    def run():
        return sample(
            model, PROMPTS, n=4, max_new_tokens=20, temperature=0.9, top_p=0.95, eos_id=[1, 2],
            pad_id=0, generator=torch.Generator().manual_seed(5), check_every=4,
        )  # fmt: skip

    dynamic = run()
    monkeypatch.setattr(
        sampler_module,
        "make_decoder",
        lambda *a, **kw: FastDecoder(a[0], a[1], a[2], dtype=kw.get("dtype"), static=True),
    )
    static = run()
    assert dynamic.finished.any() and not dynamic.finished.all()
    assert torch.equal(static.response_ids, dynamic.response_ids)
    torch.testing.assert_close(static.logprobs, dynamic.logprobs, atol=1e-5, rtol=0)


def test_rollout_cuda_graphs_reaches_the_sampler(monkeypatch):
    import vapo_lab.rollout as rollout

    seen = []
    monkeypatch.setattr(rollout, "sample", lambda *a, **kw: seen.append(kw["graphs"]))
    for graphs in (True, False):
        rollout.make_generator("builtin", None, 8, [1], 0, graphs=graphs)([[5]], 1, 1.0, 1.0, None)
    assert seen == [True, False]
    from vapo_lab.config.compose import compose_config

    assert compose_config().cfg.rollout.cuda_graphs is True
    assert compose_config(overrides=["rollout.cuda_graphs=false"]).cfg.rollout.cuda_graphs is False
