"""Checks the plan's memory formulas (``vapo_lab.models.footprint``) against peaks measured on CPU.

``python -m vapo_lab.bench.plan_check`` builds a Qwen2 in code (by default 110.6M parameters, its
critic 77.9M) and one micro-batch of 4 rows x (64 prompt + 448 response) tokens, every token valid.
It measures, each case in a fresh subprocess, the training state (params, gradients and AdamW's m
and v, against 16·P) and one training pass through the trainer's code (actor or critic; float32,
bf16 autocast or bf16-cast; checkpointing off or on; packed or padded; default or math SDPA)
against the plan's figure, the per-tensor formula and, without checkpointing, the bytes autograd
saves. Setup, method and results: docs/benchmarks.md#plan-against-measured-memory.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace

from vapo_lab.bench.logits_memory import (
    MMAP_THRESHOLD,
    _reset_high_water_mark,
    _status_bytes,
    available_bytes,
)
from vapo_lab.models.activations import qwen2_pass_activation_bytes, qwen2_saved_bytes
from vapo_lab.models.counts import actor_params, critic_params
from vapo_lab.models.footprint import Setup, estimate
from vapo_lab.models.shapes import Shape

# refuse a case predicted to need more than this share of the memory available (other jobs share it)
SAFE_SHARE = 0.8


@dataclass(frozen=True)
class CheckSpec:
    """The model and the micro-batch measured."""

    hidden: int = 1024
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 2816
    vocab: int = 32_000
    rows: int = 4
    prompt: int = 64
    response: int = 448
    seed: int = 0

    def shape(self) -> Shape:
        """Returns the model's ``Shape`` (untied, Qwen2's q/k/v biases)."""
        return Shape(
            hidden_size=self.hidden,
            num_layers=self.layers,
            num_heads=self.heads,
            num_kv_heads=self.kv_heads,
            head_dim=self.hidden // self.heads,
            intermediate_size=self.intermediate,
            vocab_size=self.vocab,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        )


@dataclass(frozen=True)
class Case:
    """One measurement: a model's training state, or one training pass of it."""

    name: str
    model: str  # actor | critic
    kind: str  # state | pass
    checkpointing: bool = False
    dtype: str = "float32"  # the compute dtype: float32 | bfloat16
    # bf16 by autocast over float32 masters, or cast: the model cast to bf16 (FSDP2's)
    precision: str = "autocast"
    layout: str = "packed"  # packed | padded
    attention: str = "default"  # default | math (torch's SDPA backend)


CASES = (
    Case("actor state", "actor", "state"),
    Case("critic state", "critic", "state"),
    Case("actor pass", "actor", "pass"),
    Case("actor pass ckpt", "actor", "pass", checkpointing=True),
    Case("critic pass", "critic", "pass"),
    Case("critic pass ckpt", "critic", "pass", checkpointing=True),
    Case("actor pass padded", "actor", "pass", layout="padded"),
    Case("critic pass math-SDPA", "critic", "pass", attention="math"),
    Case("actor pass bf16", "actor", "pass", dtype="bfloat16"),
    Case("actor pass bf16 ckpt", "actor", "pass", checkpointing=True, dtype="bfloat16"),
    Case("critic pass bf16", "critic", "pass", dtype="bfloat16"),
    Case("critic pass bf16 ckpt", "critic", "pass", checkpointing=True, dtype="bfloat16"),
    Case("actor pass bf16-cast", "actor", "pass", dtype="bfloat16", precision="cast"),
    Case(
        "actor pass bf16-cast ckpt",
        "actor",
        "pass",
        checkpointing=True,
        dtype="bfloat16",
        precision="cast",
    ),
    Case("critic pass bf16-cast", "critic", "pass", dtype="bfloat16", precision="cast"),
    Case(
        "critic pass bf16-cast ckpt",
        "critic",
        "pass",
        checkpointing=True,
        dtype="bfloat16",
        precision="cast",
    ),
)
BYTES = {"float32": 4, "bfloat16": 2}


def plan_setup(spec: CheckSpec, checkpointing: bool, dtype: str) -> Setup:
    """Returns the one-rank ``Setup`` whose pass is the measured micro-batch (chunked head)."""
    from vapo_lab.algo.lm import default_chunk_tokens

    return Setup(
        world=1,
        strategy="single",
        dtype=dtype,
        micro_tokens=spec.rows * (spec.prompt + spec.response),
        responses_per_step=spec.rows,
        prompt_tokens=spec.prompt,
        max_new_tokens=spec.response,
        gradient_checkpointing=checkpointing,
        mini_batch_size=spec.rows,
        critic=True,
        logprob_chunk=default_chunk_tokens(spec.vocab),
    )


def predicted(case: Case, spec: CheckSpec) -> dict:
    """Returns the plan's and the per-tensor formula's figures for ``case``, and its saved bytes."""
    shape = spec.shape()
    if case.kind == "state":
        params = actor_params(shape) if case.model == "actor" else critic_params(shape)
        return {"params": params, "plan_bytes": 16 * params, "params_formula": 4 * params}
    setup = plan_setup(spec, case.checkpointing, case.dtype)
    fp = estimate(shape, setup)
    field = f"{case.model}_activations_{'ckpt' if case.checkpointing else 'full'}"
    head = "lm" if case.model == "actor" else "value"
    p, scores = BYTES[case.dtype], case.attention == "math"
    formula = qwen2_pass_activation_bytes(
        shape,
        spec.rows,
        spec.prompt,
        spec.response,
        case.checkpointing,
        head,
        p,
        scores,
        case.layout,
        setup.logprob_chunk,
        case.precision,
    )
    saved = qwen2_saved_bytes(
        shape, spec.rows, spec.prompt, spec.response, head, p, scores, case.layout, case.precision
    )
    assert fp.pass_tokens == spec.rows * (spec.prompt + spec.response)
    return {"plan_bytes": getattr(fp, field), "formula_bytes": formula, "saved_formula": saved}


def full_rows(spec: CheckSpec, rows: int, prompt: int, response: int, seed: int):
    """Returns rows of distinct random prompts and responses, every token valid."""
    import torch

    from vapo_lab.trainer.forward import Rows

    g = torch.Generator().manual_seed(seed)
    return Rows(
        torch.randint(0, spec.vocab, (rows, prompt), generator=g),
        torch.ones(rows, prompt, dtype=torch.bool),
        torch.randint(0, spec.vocab, (rows, response), generator=g),
        torch.ones(rows, response, dtype=torch.bool),
    )


def pass_rows(spec: CheckSpec, layout: str, seed: int):
    """Returns the measured micro-batch: ``full_rows``, the packed path's worst case.

    For the padded layout the last row's first prompt token and last response token are padding,
    as rows that take Hugging Face's padded forward have some (so it passes a mask).
    """
    rows = full_rows(spec, spec.rows, spec.prompt, spec.response, seed)
    if layout == "padded":
        rows.prompt_mask[-1, 0] = False
        rows.response_mask[-1, -1] = False
    return rows


@contextlib.contextmanager
def pass_layout(name: str):
    """Makes the trainer's passes take the ``packed`` path whatever the rows, or HF's ``padded``."""
    from vapo_lab.bench.update import padded_path
    from vapo_lab.models import packed

    if name == "padded":
        with padded_path():
            yield
        return
    original = packed.PACK_BELOW_SHARE
    packed.PACK_BELOW_SHARE = 2.0  # a valid share is at most 1: every layout packs
    try:
        yield
    finally:
        packed.PACK_BELOW_SHARE = original


def build_model(case: Case, spec: CheckSpec):
    """Returns ``case``'s seeded float32 model: a Qwen2ForCausalLM or a ``ValueModel`` (critic)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

    from vapo_lab.models.value import ValueModel

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        intermediate_size=spec.intermediate,
        vocab_size=spec.vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    if case.model == "actor":
        return Qwen2ForCausalLM(config)
    return ValueModel(Qwen2Model(config), spec.hidden)


def training_model(case: Case, spec: CheckSpec):
    """Returns ``build_model``'s model in training mode, as ``case`` asks it checkpointed and typed.

    bf16 is autocast over float32 masters (``set_compute``, as trainer.strategy=single) or the model
    cast to it (what FSDP2's MixedPrecisionPolicy computes with).
    """
    from vapo_lab.models.dtypes import DTYPES
    from vapo_lab.models.packed import enable_checkpointing
    from vapo_lab.models.precision import set_compute

    model = build_model(case, spec)
    if case.checkpointing:
        enable_checkpointing(model if case.model == "actor" else model.backbone)
    model.train()
    if case.dtype != "float32" and case.precision == "cast":
        model.to(DTYPES[case.dtype])
    elif case.dtype != "float32":
        set_compute(model, case.dtype)
    return model


def sdpa_backend(name: str):
    """Returns a context in which torch's SDPA runs its ``default`` choice or ``math`` backend."""
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def pass_loss(model, rows, actor: bool):
    """Returns (a token-mean loss over the response tokens, the pass's output).

    The actor's: −mean log π and the log-probs; the critic's: mean (V − 1)² and the values.
    """
    from vapo_lab.algo.masked import masked_mean
    from vapo_lab.trainer.forward import policy_forward, value_forward

    if actor:
        logprobs, entropy = policy_forward(model, rows, with_entropy=True)
        assert entropy is not None
        return -masked_mean(logprobs, rows.response_mask), logprobs
    values = value_forward(model, rows)
    return masked_mean((values - 1.0) ** 2, rows.response_mask), values


def saved_by_autograd(output, model) -> tuple[int, list[str]]:
    """Returns (bytes of the float tensors the graph behind ``output`` saves, its SDPA node names).

    Read from every node's ``_saved_*`` (or a custom Function's ``saved_tensors``), parameters
    excluded, each storage once: what ``qwen2_saved_bytes`` counts. Call it before backward and
    without checkpointing: unpacking a checkpointed tensor would recompute its layer.
    """
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    sizes: dict[int, int] = {}
    attention: set[str] = set()
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = node.name()
        if "Attention" in name or "ScaledDotProduct" in name:
            attention.add(name)
        if name == "AccumulateGrad":
            continue
        values = [getattr(node, a) for a in dir(node) if a.startswith("_saved_")]
        if not values and hasattr(node, "saved_tensors"):
            values = list(node.saved_tensors)
        for value in values:
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if (
                    isinstance(t, torch.Tensor)
                    and t.is_floating_point()
                    and t.untyped_storage().data_ptr() not in params
                ):
                    sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        stack.extend(next_node for next_node, _ in node.next_functions)
    return sum(sizes.values()), sorted(attention)


def measure_case(case: Case, spec: CheckSpec) -> dict:
    """Runs ``case`` in this process and returns its measurements."""
    import torch

    actor = case.model == "actor"
    if case.kind == "state":
        # the same classes at a tiny size first: transformers imports its modules lazily (about
        # 90 MB of code on the first model built) and the libraries start
        tiny = replace(spec, hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128, vocab=128)
        warm = build_model(case, tiny)
        with pass_layout(case.layout):
            pass_loss(warm, full_rows(tiny, 1, 4, 4, spec.seed + 1), actor)[0].backward()
        torch.optim.AdamW(warm.parameters(), fused=True).step()
        del warm
        gc.collect()
        base = _status_bytes("VmRSS")
        model = build_model(case, spec)
        gc.collect()
        built = _status_bytes("VmRSS")
        model.train()
        with pass_layout(case.layout):
            pass_loss(model, full_rows(spec, 1, 4, 4, spec.seed + 1), actor)[0].backward()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
        optimizer.step()  # m and v: kept while the optimizer lives
        gc.collect()
        after = _status_bytes("VmRSS")
        assert all(len(optimizer.state[p]) for p in model.parameters())
        return {
            "case": case.name,
            "params_bytes": built - base,
            "measured_bytes": after - base,
            "params": sum(p.numel() for p in model.parameters()),
        }
    model = training_model(case, spec)
    attention = sdpa_backend(case.attention)
    with pass_layout(case.layout), attention:
        rows = pass_rows(spec, case.layout, spec.seed + 2)
        # a first pass over the same rows leaves what a step's second micro-batch finds: the
        # gradients resident, the libraries' threads, kernels and scratch at their steady size
        pass_loss(model, rows, actor)[0].backward()
        gc.collect()
        _reset_high_water_mark()
        before = _status_bytes("VmRSS")
        start = time.perf_counter()
        loss, output = pass_loss(model, rows, actor)
        saved, backends = (None, []) if case.checkpointing else saved_by_autograd(output, model)
        del output
        loss.backward()
        seconds = time.perf_counter() - start
        after = _status_bytes("VmHWM")
    return {
        "case": case.name,
        "measured_bytes": after - before,
        "saved_bytes": saved,
        "sdpa_nodes": backends,
        "seconds": seconds,
    }


def run_plan_check(
    spec: CheckSpec = CheckSpec(),
    cases: tuple[Case, ...] = CASES,
    threads: int | None = None,
    log=lambda text: None,
) -> list[dict]:
    """Measures each case in a fresh subprocess; returns a dict a case beside the plan and formula.

    A case predicted to need more than ``SAFE_SHARE`` of the available memory is skipped, the reason
    in its row.
    """
    out = []
    for case in cases:
        row = {"case": case.name, **asdict(case), **predicted(case, spec)}
        need = 2 * (16 * actor_params(spec.shape()) + row.get("formula_bytes", 0))
        if need > SAFE_SHARE * available_bytes():
            row["skipped"] = (
                f"needs ~{need / 1e9:.1f} GB, {available_bytes() / 1e9:.1f} GB available"
            )
            out.append(row)
            continue
        log(f"{case.name}: running")
        command = [
            sys.executable,
            "-m",
            "vapo_lab.bench.plan_check",
            "--child",
            json.dumps(asdict(case)),
            "--spec",
            json.dumps(asdict(spec)),
        ]
        if threads:
            command += ["--threads", str(threads)]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
        result = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        row.update(json.loads(result.stdout.strip().splitlines()[-1]))
        row["measured/plan"] = row["measured_bytes"] / row["plan_bytes"]
        if "formula_bytes" in row:
            row["measured/formula"] = row["measured_bytes"] / row["formula_bytes"]
        if row.get("saved_bytes"):
            row["saved/formula"] = row["saved_bytes"] / row["saved_formula"]
        out.append(row)
    return out


def _mb(b: float) -> str:
    return f"{b / 1e6:,.1f}"


def format_plan_check(rows: list[dict]) -> str:
    """Returns ``run_plan_check``'s rows as a plain-text table, and a legend."""
    lines = [
        (
            f"{'quantity':<34} {'measured MB':>12} {'plan MB':>10} {'/plan':>6} {'formula MB':>11} "
            f"{'/formula':>9} {'saved MB':>9} {'/formula':>9} {'s':>5}"
        )
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['case']:<34} skipped: {r['skipped']}")
            continue
        if r["kind"] == "state":
            lines.append(
                f"{r['case']:<34} {_mb(r['measured_bytes']):>12} {_mb(r['plan_bytes']):>10} "
                f"{r['measured/plan']:>6.3f} {'(16·P)':>11} {'':>9} {'':>9} {'':>9} {'':>5}"
            )
            continue
        saved = (
            f"{_mb(r['saved_bytes']):>9} {r['saved/formula']:>9.4f}"
            if r.get("saved_bytes")
            else f"{'-':>9} {'-':>9}"
        )
        lines.append(
            f"{r['case']:<34} {_mb(r['measured_bytes']):>12} {_mb(r['plan_bytes']):>10} "
            f"{r['measured/plan']:>6.3f} {_mb(r['formula_bytes']):>11} "
            f"{r['measured/formula']:>9.3f} "
            f"{saved} {r['seconds']:>5.1f}"
        )
    backends = sorted({b for r in rows for b in r.get("sdpa_nodes", [])})
    states = [r for r in rows if r.get("kind") == "state" and "params_bytes" in r]
    for r in states:
        lines.append(
            f"{r['case']}: params alone {_mb(r['params_bytes'])} MB = "
            f"{r['params_bytes'] / r['params_formula']:.3f}"
            f" x 4·P (P = {r['params']:,})"
        )
    lines += [
        f"SDPA backward nodes seen: {', '.join(backends) or '-'}",
        (
            "measured: VmHWM after the pass − VmRSS before it (gradients resident), "
            "one fresh process a case; state: VmRSS after AdamW's step − before the model; "
            "plan: footprint.estimate's "
            "{actor,critic}_activations_{full,ckpt} (16·P for the state); formula: "
            "activations.qwen2_pass_activation_bytes; saved: the autograd graph's saved tensors "
            "against activations.qwen2_saved_bytes"
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Prints the table (`python -m vapo_lab.bench.plan_check`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = CheckSpec()
    for field in (
        "hidden",
        "layers",
        "heads",
        "kv_heads",
        "intermediate",
        "vocab",
        "rows",
        "prompt",
        "response",
    ):
        parser.add_argument(
            f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field)
        )
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of the table"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(
            json.dumps(
                measure_case(Case(**json.loads(args.child)), CheckSpec(**json.loads(args.spec)))
            )
        )
        return
    spec = replace(
        defaults,
        **{
            f: getattr(args, f)
            for f in (
                "hidden",
                "layers",
                "heads",
                "kv_heads",
                "intermediate",
                "vocab",
                "rows",
                "prompt",
                "response",
            )
        },
    )
    names = args.cases.split(",") if args.cases else [c.name for c in CASES]
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        parser.error(
            f"unknown case(s) {', '.join(map(repr, unknown))}: "
            f"choose from {', '.join(c.name for c in CASES)}"
        )
    cases = tuple(c for c in CASES if c.name in names)
    rows = run_plan_check(spec, cases, args.threads, log=lambda text: print(text, file=sys.stderr))
    if args.json:
        print(json.dumps(rows))
        return
    shape = spec.shape()
    print(
        f"Plan against measured memory: Qwen2 h = {spec.hidden}, L = {spec.layers}, "
        f"{spec.heads} / {spec.kv_heads} heads of {shape.head_dim}, i = {spec.intermediate}, "
        f"V = {spec.vocab:,} (actor {actor_params(shape):,}, "
        f"critic {critic_params(shape):,} parameters); "
        f"{spec.rows} rows x ({spec.prompt} + {spec.response}) tokens; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(format_plan_check(rows))


if __name__ == "__main__":
    main()
