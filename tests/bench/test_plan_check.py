"""The per-tensor activation formulas: by hand, against autograd's saved tensors, and (slow) against
peak RSS measured in fresh processes (``vapo_lab.bench.plan_check``)."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from vapo_lab.bench.plan_check import (
    CASES,
    Case,
    CheckSpec,
    full_rows,
    pass_layout,
    pass_loss,
    pass_rows,
    saved_by_autograd,
    sdpa_backend,
    training_model,
)
from vapo_lab.models.activations import qwen2_layer_activation_bytes, qwen2_saved_bytes
from vapo_lab.models.shapes import Shape

# h = 8, a = 2 query heads and kv = 1 key-value head of d = 4 (q = 8, k = 4), i = 16
HAND = Shape(
    hidden_size=8,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    intermediate_size=16,
    vocab_size=32,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)


def test_a_packed_float32_layer_by_hand():
    # one row of 1 prompt + 2 response tokens: n = 3; p = 4
    # per token: norms 2·(4·2·8 + 4) = 136; their outputs 2·4·8 = 64; MLP 4·4·16 = 256;
    #   o_proj's input 4·8 = 32; packed: q, k after RoPE 4·(8 + 4) = 48 and v 4·4 = 16: 552 a
    #   token, 1,656
    # SDPA: q and logsumexp 3·(4·8 + 4·2) = 120; its output 3·4·8 = 96; keys 1 (prompt) + 3
    #   (response attention) = 4, K and V 4·2·4·4 = 128; pairs 1·1 + 2·3 = 7, the mask 7·4 = 28: 372
    assert qwen2_layer_activation_bytes(HAND, 1, 1, 2, compute_bytes=4) == 1_656 + 372


def test_a_packed_bf16_layer_by_hand():
    # the same under bf16 autocast, p = 2: norms 136 (float32); the q/k/v and gate/up casts
    #   5·2·8 = 80; MLP 4·2·16 = 128; o_proj's input 2·8 = 16; q, k after RoPE 4·12 = 48
    #   (float32), v 2·4 = 8: 416 a token, 1,248
    # SDPA: 3·(2·8 + 4·2) = 72; output 3·16 = 48; K and V 4·2·2·4 = 64; mask 7·2 = 14: 198
    # the weights' bf16 copies: 2·(8·(8 + 2·4) + 8·8 + 3·8·16) = 2·576 = 1,152
    assert qwen2_layer_activation_bytes(HAND, 1, 1, 2, compute_bytes=2) == 1_248 + 198 + 1_152


def test_stored_scores_and_the_padded_layout_by_hand():
    # math SDPA, p = 4: the fused terms (q and logsumexp 120, output 96, K and V 128, mask 28) give
    # way to q·scale 3·4·8 = 96, the probabilities 7 pairs·4·2 heads = 56 and K, V repeated to 2
    # heads 4 keys·2·4·8 = 256: 1,656 + 408
    assert qwen2_layer_activation_bytes(HAND, 1, 1, 2, 4, scores_stored=True) == 1_656 + 408
    # padded, p = 4: 488 a token (no RoPE'd copies, SDPA's output is o_proj's input), 1,464;
    # SDPA: q and logsumexp 120; K and V repeated beside the mask, 3 keys·2·4·8 = 192;
    # 3² pairs·4 = 36: 348
    assert qwen2_layer_activation_bytes(HAND, 1, 1, 2, 4, layout="padded") == 1_464 + 348


# a tiny model: h = 64, L = 2, 4 query / 2 key-value heads of 16, i = 176, V = 256
TINY = CheckSpec(
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    intermediate=176,
    vocab=256,
    rows=2,
    prompt=3,
    response=5,
)


@pytest.mark.parametrize("model", ["actor", "critic"])
# (math SDPA only in float32: on CPU it computes bf16 inputs in float32, which the formula, written
# for a GPU's compute dtype, does not count)
@pytest.mark.parametrize(
    "layout,dtype,attention,precision",
    [
        ("packed", "float32", "default", "autocast"),
        ("packed", "bfloat16", "default", "autocast"),
        ("packed", "bfloat16", "default", "cast"),
        ("packed", "float32", "math", "autocast"),
        ("padded", "float32", "default", "autocast"),
        ("padded", "bfloat16", "default", "autocast"),
        ("padded", "bfloat16", "default", "cast"),
    ],
)
def test_saved_tensors_are_the_formulas_to_the_byte(model, layout, dtype, attention, precision):
    """Every floating-point tensor autograd keeps for a pass's backward (parameters aside) is one
    the formula counts: the sums agree exactly, in both layouts, dtypes, precisions and SDPA
    backends."""
    torch.manual_seed(0)
    case = Case(
        "tiny", model, "pass", dtype=dtype, layout=layout, attention=attention, precision=precision
    )
    net = training_model(case, TINY)
    # packed: every token valid (the formula's worst case, counted exactly); padded: rows with
    # padding (row 1: a 2-token prompt, a 4-token response), so that Hugging Face passes a mask
    rows = pass_rows(TINY, layout, 2)
    with pass_layout(layout), sdpa_backend(attention):
        _, output = pass_loss(net, rows, model == "actor")
    saved, _ = saved_by_autograd(output, net)
    head = "lm" if model == "actor" else "value"
    p = 4 if dtype == "float32" else 2
    expected = qwen2_saved_bytes(
        TINY.shape(),
        TINY.rows,
        TINY.prompt,
        TINY.response,
        head,
        p,
        attention == "math",
        layout,
        precision,
    )
    if model == "actor":
        # the chunked head's float32 logsumexp (in chunked_logprob_bytes)
        expected += 4 * TINY.rows * TINY.response
    assert saved == expected


def test_cpu_runs_its_flash_kernel_with_the_packed_mask():
    # the packed path's boolean mask with grouped-query heads: CPU SDPA runs its flash kernel (no
    # stored probabilities), keeping the mask as an additive float bias (scores_stored=False)
    net = training_model(Case("tiny", "critic", "pass"), TINY)
    with pass_layout("packed"):
        _, output = pass_loss(net, full_rows(TINY, 2, 3, 5, 2), False)
    assert saved_by_autograd(output, net)[1] == ["ScaledDotProductFlashAttentionForCpuBackward0"]


# A reduced size for the RSS test: h = 512, L = 2, 8 / 2 heads of 64, i = 1408, V = 16,000 (actor
# 22.0M, critic 13.8M parameters); 2 rows x (64 + 448) = 1,024 tokens.
SMALL = CheckSpec(
    hidden=512,
    layers=2,
    heads=8,
    kv_heads=2,
    intermediate=1408,
    vocab=16_000,
    rows=2,
    prompt=64,
    response=448,
)
SLOW_CASES = (
    "actor state",
    "actor pass",
    "actor pass ckpt",
    "critic pass",
    "critic pass ckpt",
    "actor pass bf16 ckpt",
    "critic pass bf16-cast ckpt",
)


@pytest.mark.slow
def test_measured_peaks_are_within_15_percent_of_the_formulas():
    """Peak RSS in fresh processes (python -m vapo_lab.bench.plan_check): the training state against
    16·P, each pass against qwen2_pass_activation_bytes. Measured on a 2-core AMD EPYC, 2026-11-27:
    the state 1.020 x 16·P (params alone 1.001 x 4·P); the passes 0.969-1.054 x the formula (the
    plan's Korthikanti figures: 0.80-1.83 x); about 110 s."""
    spec_args = [
        f"--{f.name.replace('_', '-')}={getattr(SMALL, f.name)}"
        for f in dataclasses.fields(SMALL)
        if f.name != "seed"
    ]
    assert set(SLOW_CASES) <= {c.name for c in CASES}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vapo_lab.bench.plan_check",
            *spec_args,
            "--cases",
            ",".join(SLOW_CASES),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    rows = {r["case"]: r for r in json.loads(out.stdout)}
    assert set(rows) == set(SLOW_CASES) and not any("skipped" in r for r in rows.values())
    state = rows["actor state"]
    assert abs(state["measured/plan"] - 1) <= 0.15, state
    assert abs(state["params_bytes"] / state["params_formula"] - 1) <= 0.15, state
    for name in SLOW_CASES[1:]:
        assert abs(rows[name]["measured/formula"] - 1) <= 0.15, rows[name]
        if rows[name]["saved_bytes"]:
            assert rows[name]["saved/formula"] == pytest.approx(1, abs=1e-3)
