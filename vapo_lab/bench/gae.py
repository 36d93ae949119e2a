"""Benchmarks `vapo_lab.algo.gae.gae` against the reverse-time GAE loop and the memory floor.

`python -m vapo_lab.bench.gae` times the default shapes (512×4096 and 8192×1024, float32,
per-response length-adaptive λ, γ = 1), with `gae`'s torch scan beside it, interleaved. Every
candidate sees the same batch (random lengths, right padding, garbage where padded); the benchmark
fails if advantages or returns differ from the loop's by more than 1e-5. Results:
docs/benchmarks.md#gae.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from vapo_lab.algo.gae import gae, gae_reference, length_adaptive_lambda
from vapo_lab.algo.gae_cpu import scan_kernel
from vapo_lab.errors import ConfigError

# Largest |difference| accepted between the two implementations (float32, |A| of order 1).
TOLERANCE = 1e-5


def _benchmark_batch(
    batch: int, length: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rewards, values, prefix mask and per-response λ for one benchmark shape, all (B, T) or (B,).

    Lengths are uniform in 1..T; the reward (0 or 1) sits at the last valid token; values are
    uniform in [0, 1) on valid tokens and large garbage on padded ones. λ is length-adaptive with
    α = 0.05·512/T, so λ spans [0, 0.96] at every T instead of saturating near 1.
    """
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    rows = torch.arange(batch)
    rewards = torch.randn(batch, length, generator=generator) * 10.0  # garbage where padded
    rewards = torch.where(mask, torch.zeros(()), rewards)
    rewards[rows, lengths - 1] = torch.randint(0, 2, (batch,), generator=generator).float()
    values = torch.rand(batch, length, generator=generator)
    garbage = torch.randn(batch, length, generator=generator) * 10.0
    values = torch.where(mask, values, garbage)
    lam = length_adaptive_lambda(lengths, alpha=0.05 * 512 / length)
    return rewards, values, mask, lam


def memory_floor(
    rewards: Tensor, values: Tensor, response_mask: Tensor, out: tuple[Tensor, Tensor]
) -> None:
    """Does the least work any GAE must: reads rewards, values and mask once, writes two outputs.

    Torch's cheapest streaming ops and no scan, so its time is memory traffic only: the floor that
    ``gae`` is measured against (the ``x floor`` column; why a copy, not a masked product:
    docs/benchmarks.md#gae).
    """
    torch.sub(rewards, values, out=out[0])
    out[1].copy_(values)
    response_mask.view(torch.uint8).max()


def _interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Returns each fn's median wall time in ms over `repeats` rounds of every fn once, in turn.

    One warm-up call each first (it also compiles the numba kernel); interleaving makes a slow
    stretch of a shared machine hit every candidate alike.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def run_gae_benchmark(
    shapes: Sequence[tuple[int, int]] = ((512, 4096), (8192, 1024)),
    repeats: int = 5,
    seed: int = 0,
    threads: int | None = None,
) -> list[dict[str, float | int | str]]:
    """Times `gae`, its torch scan, `gae_reference` and the memory floor, one row per (B, T) shape.

    `gae` and the floor are timed twice: into preallocated outputs (``out=``) and into new ones
    (``gae``'s default), whose page faults can cost more than the scan.

    Args:
        repeats: timed rounds; every candidate runs once per round (interleaved), medians reported.
        threads: torch intra-op threads during the benchmark; None keeps the current setting.

    Returns:
        One dict per shape: B, T, scan ("compiled" or "torch": what `gae` used), gae_ms,
        torch_scan_ms, loop_ms, floor_ms, x_floor, speedup (loop / gae), new_outputs_ms and
        new_floor_ms (allocating their outputs), x_new_floor, and max_abs_diff (either scan's
        largest |difference| from the loop).

    Raises:
        RuntimeError: if either scan differs from the loop by more than TOLERANCE.
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(seed)
        scan = "compiled" if scan_kernel() is not None else "torch"
        rows = []
        for batch, length in shapes:
            rewards, values, mask, lam = _benchmark_batch(batch, length, generator)
            args = (rewards, values, mask, lam, 1.0)  # γ = 1, as in VAPO
            slow = gae_reference(*args)
            diff = 0.0
            for which in ("auto", "torch"):
                fast = gae(*args, scan=which)
                diff = max(diff, *((f - s).abs().max().item() for f, s in zip(fast, slow)))
            if not diff <= TOLERANCE:  # also catches nan
                raise RuntimeError(
                    f"gae's scan differs from the loop by {diff:.3g} > {TOLERANCE:g} at "
                    f"B={batch}, T={length}: the scan is wrong or imprecise."
                )
            out = (torch.empty_like(values), torch.empty_like(values))

            def new_floor() -> None:
                memory_floor(
                    rewards, values, mask, (torch.empty_like(values), torch.empty_like(values))
                )

            ms = _interleaved_medians(
                {
                    "gae": functools.partial(gae, *args, out=out),
                    "torch_scan": functools.partial(gae, *args, out=out, scan="torch"),
                    "floor": functools.partial(memory_floor, rewards, values, mask, out),
                    "new_outputs": functools.partial(gae, *args),
                    "new_floor": new_floor,
                },
                repeats,
            )
            loop_ms = _interleaved_medians(
                {"loop": functools.partial(gae_reference, *args)}, repeats
            )["loop"]
            rows.append(
                {
                    "B": batch,
                    "T": length,
                    "scan": scan,
                    "gae_ms": ms["gae"],
                    "torch_scan_ms": ms["torch_scan"],
                    "loop_ms": loop_ms,
                    "speedup": loop_ms / ms["gae"],
                    "floor_ms": ms["floor"],
                    "x_floor": ms["gae"] / ms["floor"],
                    "new_outputs_ms": ms["new_outputs"],
                    "new_floor_ms": ms["new_floor"],
                    "x_new_floor": ms["new_outputs"] / ms["new_floor"],
                    "max_abs_diff": diff,
                }
            )
        return rows
    finally:
        torch.set_num_threads(previous_threads)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """Returns [(B, T), ...] from text like ``"512x4096,8192x1024"``; ConfigError if malformed."""
    shapes = []
    for part in text.split(","):
        b, sep, t = part.strip().lower().partition("x")
        if not sep or not b.isdigit() or not t.isdigit() or int(b) < 1 or int(t) < 1:
            raise ConfigError(
                f"--shapes {text!r}: {part.strip()!r} is not BxT with positive integers, "
                "e.g. --shapes 512x4096,8192x1024"
            )
        shapes.append((int(b), int(t)))
    return shapes


def format_gae_benchmark(rows: Sequence[dict[str, float | int | str]]) -> str:
    """Returns `run_gae_benchmark`'s rows as a plain-text table, one line a shape, and a legend."""
    lines = [
        f"{'B':>6} {'T':>6} {'gae ms':>8} {'torch scan':>11} {'loop ms':>9} {'speedup':>8} "
        f"{'floor ms':>9} {'x floor':>8} {'new out ms':>11} {'new floor':>10} {'x':>6} "
        f"{'max |diff|':>11}"
    ]
    for row in rows:
        lines.append(
            f"{row['B']:>6} {row['T']:>6} {row['gae_ms']:>8.2f} {row['torch_scan_ms']:>11.2f} "
            f"{row['loop_ms']:>9.1f} {row['speedup']:>7.1f}x {row['floor_ms']:>9.2f} "
            f"{row['x_floor']:>7.1f}x "
            f"{row['new_outputs_ms']:>11.2f} {row['new_floor_ms']:>10.2f} "
            f"{row['x_new_floor']:>5.1f}x "
            f"{row['max_abs_diff']:>11.1e}"
        )
    scan = rows[0]["scan"] if rows else "compiled"
    lines += [
        f"gae: its {scan} scan"
        + (" (numba is not importable: the torch scan)" if scan == "torch" else "")
        + ", into preallocated outputs (out=); torch scan: the same call with scan='torch' "
        "(the code before the compiled CPU scan); loop: the reverse-time loop over steps; "
        "speedup = loop / gae",
        "floor: reading rewards, values and the mask once and writing two (B, T) outputs, no scan "
        "(bench.gae.memory_floor); x floor = gae / floor",
        "new out / new floor: the same two with newly allocated outputs (gae's default call); "
        "x = their ratio",
    ]
    return "\n".join(lines)


def main() -> None:
    """Prints the benchmark table for the default shapes (`python -m vapo_lab.bench.gae`)."""
    rows = run_gae_benchmark()
    print(
        f"GAE, float32, per-response λ, γ = 1; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; median of 5 interleaved rounds"
    )
    print(format_gae_benchmark(rows))


if __name__ == "__main__":
    main()
