"""Generalised advantage estimation (GAE) for token-level PPO, without a Python loop over time.

VAPO (arXiv 2504.05118) uses GAE three ways: λ = 1 Monte-Carlo returns for value pretraining,
decoupled λ_critic / λ_policy, and a per-response length-adaptive λ_policy. All three reduce to
one reverse scan per response,

    A_t = δ_t + γλ·A_{t+1},   δ_t = r_t + γ·V_{t+1} − V_t,   A_L = 0, V_L = 0,

which `gae` evaluates without a Python loop over the T time steps: on CPU as one compiled loop
per response (`vapo_lab.algo.gae_cpu`), elsewhere as a chunked scan of batched matmuls (see
`_reverse_discounted_cumsum`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from vapo_lab.algo.gae_cpu import scan_kernel

# λ_policy: length-adaptive 1 − 1/(α·l) per response (VAPO) or the fixed gae.lam_policy;
# λ_critic: its own gae.lam_critic (decoupled, VC-PPO) or the same λ as the policy (shared)
LAMBDA_POLICY_MODES = ("length_adaptive", "fixed")
LAMBDA_CRITIC_MODES = ("decoupled", "shared")
# advantage estimators: GAE over a value model, or group-relative (DAPO, GRPO: no critic)
ADVANTAGE_ESTIMATORS = ("gae", "group")

# Chunk size K of the chunked scan. K trades the matmul's work (B·T·K multiply-adds) against
# the number of recursion levels (log_K T); with one λ per response the B discount matrices also
# cost B·K² to build, against the data's B·T. K = 16 was fastest or tied for both kinds of λ:
# larger K loses to the extra matmul work (and, per response, to the B·K² matrices), smaller K to
# the extra levels (timings: docs/benchmarks.md#torch-scan-settings).
_CHUNK = 16
# how gae scans: the compiled CPU loop where it can, else torch; one of them by name (tests, bench)
SCANS = ("auto", "compiled", "torch")

# On CPU the batch is processed in blocks of about this many (B·T) elements (8 MiB of float32),
# so that no temporary reaches 32 MiB, from which glibc maps fresh pages on every call and the
# page faults show, while keeping the number of ops small: every op over ≥ 32k elements and every
# bmm is an OpenMP parallel region, which can stall on a machine shared with other jobs (timings:
# docs/benchmarks.md#torch-scan-settings). This loop runs over rows, never over time steps. On
# accelerators the batch is one block.
_CPU_BLOCK_ELEMENTS = 1 << 21


def length_adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """Per-response λ_policy = 1 − 1/(α·l), clamped to [0, 1] (VAPO length-adaptive GAE).

    VAPO sets the GAE horizon 1/(1 − λ) proportional to the response length, 1/(1 − λ) = α·l, so
    long responses get λ close to 1 (low bias) and short ones a smaller λ (low variance).

    Args:
        lengths: response lengths l in tokens, shape (B,), integer or floating.
        alpha: α > 0; the paper uses 0.05.

    Returns:
        λ_policy, shape (B,), float32 (float64 if `lengths` is float64). The paper is silent where
        α·l < 1 and the formula is ≤ 0; we clamp to [0, 1], so those responses (and l ≤ 0) get
        λ = 0, i.e. one-step TD advantages A_t = δ_t.

    Raises:
        ValueError: if alpha is not > 0.
    """
    if not alpha > 0:  # also rejects nan
        raise ValueError(
            f"alpha={alpha!r} is not positive: length-adaptive GAE needs α > 0 in "
            "λ = 1 − 1/(α·l). Set alpha to a positive value (the paper uses 0.05)."
        )
    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    l = lengths.to(dtype)
    positive = l > 0
    # Guard l ≤ 0 before dividing: 1/(α·0) is inf, and a negative l would give λ > 1.
    safe_l = torch.where(positive, l, torch.ones_like(l))
    lam = (1.0 - 1.0 / (alpha * safe_l)).clamp(0.0, 1.0)  # λ = 1 − 1/(α·l), clamped to [0, 1]
    return torch.where(positive, lam, torch.zeros_like(lam))


def gae(
    rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    lam: float | Tensor,
    gamma: float = 1.0,
    *,
    out: tuple[Tensor, Tensor] | None = None,
    scan: str = "auto",
) -> tuple[Tensor, Tensor]:
    """Advantages and returns from generalised advantage estimation over each response's tokens.

    With L_b the number of valid tokens of response b and V_{L_b} = 0 (the value after the last
    valid token is the terminal value):

        δ_t = r_t + γ·V_{t+1} − V_t
        A_t = Σ_{l≥0} (γλ)^l · δ_{t+l}     (sum over valid tokens, t + l < L_b)
        returns_t = A_t + V_t

    λ = 1, γ = 1 gives the Monte-Carlo return returns_t = Σ_{s≥t} r_s (the VAPO critic target);
    λ = 0 gives A_t = δ_t. Worked example, γ = 1, rewards [0, 0, 1], values [0.5, 0.5, 0.5]:
    δ = [0, 0, 0.5]; λ = 0.5 gives A = [0.125, 0.25, 0.5]; λ = 1 gives returns [1, 1, 1].

    On CPU the scan is one compiled loop per response (`vapo_lab.algo.gae_cpu`, numba): it reads
    the inputs and writes the outputs once. Elsewhere, or without numba, it runs without a Python
    loop over time (see `_reverse_discounted_cumsum`): O(B·T·K) work in batched matmuls plus
    O(log_K T) recursion levels (K = 16). The two agree to float rounding.

    Args:
        rewards: token rewards r, shape (B, T); usually the verifier's reward at the last valid
            token and 0 elsewhere.
        values: critic values V(s_t) of the state before token t, shape (B, T).
        response_mask: (B, T) bool or float {0, 1} prefix mask (ones at t < L_b, zeros after;
            L_b may be 0). Rewards and values at masked positions may hold any finite or
            non-finite garbage: it never reaches an output.
        lam: λ, a python float in [0, 1], or a tensor of shape (B,) with one λ per response
            (e.g. `length_adaptive_lambda`), applied exactly per response.
        gamma: discount γ (VAPO uses 1.0).
        out: optional (advantages, returns) tensors to write into, each (B, T) with the dtype and
            device of `values`: callers that keep buffers skip two fresh allocations (of 32 MiB
            and more, whose page faults can cost more than the scan: docs/benchmarks.md#gae).
        scan: "auto" (the compiled CPU scan for CPU tensors when numba is importable, else the
            torch scan), "compiled" (the CPU scan or an error) or "torch" (the torch scan: the
            one for accelerators, kept as the fallback and the benchmark's previous code).

    Returns:
        (advantages, returns), each (B, T) with the dtype of `values`, detached (they are targets,
        constants of the PPO losses); exactly 0 where the mask is 0. `out` itself when given.

    Raises:
        ValueError: if the shapes of rewards, values and response_mask differ or are not 2-D,
            if a tensor lam is not of shape (B,), if a float lam or gamma is outside [0, 1], if
            `out` does not match, if `scan` is not one of SCANS or "compiled" is not available,
            or (compiled scan) if a mask row is not a prefix.
    """
    if values.dim() != 2 or rewards.shape != values.shape or response_mask.shape != values.shape:
        raise ValueError(
            f"gae needs rewards, values and response_mask of one shape (B, T); got rewards "
            f"{tuple(rewards.shape)}, values {tuple(values.shape)}, response_mask "
            f"{tuple(response_mask.shape)}. Pass token-level (B, T) tensors."
        )
    batch, length = values.shape
    if isinstance(lam, Tensor):
        if lam.shape != (batch,):
            raise ValueError(
                f"lam has shape {tuple(lam.shape)} but gae needs a python float or one λ per "
                f"response, shape ({batch},). Pass a float or a (B,) tensor."
            )
    elif not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam!r} is outside [0, 1]; GAE's λ must lie in [0, 1].")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma!r} is outside [0, 1]; the discount γ must lie in [0, 1].")
    if scan not in SCANS:
        raise ValueError(f"scan={scan!r} is not one of {SCANS}.")
    kernel = scan_kernel() if scan != "torch" and values.device.type == "cpu" else None
    if scan == "compiled" and kernel is None:
        raise ValueError(
            "scan='compiled' needs CPU tensors and numba (pip install numba); use scan='auto'."
        )

    # Half precision would lose the λ powers; compute in at least float32, return values' dtype.
    out_dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    dtype = torch.promote_types(out_dtype, torch.float32)
    device = values.device
    # GAE outputs are targets (constants of the PPO losses): no gradient flows through them.
    rewards, values, mask = rewards.detach(), values.detach(), response_mask.detach().bool()
    if isinstance(lam, Tensor):
        coef = gamma * lam.detach().to(device=device, dtype=dtype)  # γλ_b per response, (B,)
    else:
        coef = torch.tensor(gamma * lam, dtype=dtype, device=device)  # γλ shared, 0-dim

    if out is None:
        advantages = torch.empty((batch, length), dtype=out_dtype, device=device)
        returns = torch.empty((batch, length), dtype=out_dtype, device=device)
    else:
        advantages, returns = out
        for name, tensor in (("advantages", advantages), ("returns", returns)):
            if (
                tensor.shape != (batch, length)
                or tensor.dtype != out_dtype
                or tensor.device != device
            ):
                raise ValueError(
                    f"out's {name} is {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}; gae "
                    f"writes ({batch}, {length}) {out_dtype} on {device}. Pass matching tensors or "
                    "leave out unset."
                )
    if batch == 0 or length == 0:
        return advantages, returns
    if kernel is not None:
        _gae_on_cpu(kernel, rewards, values, mask, coef, gamma, dtype, advantages, returns)
        return advantages, returns
    levels = _scan_plan(length, coef)  # discount matrices, built once for all blocks
    if device.type == "cpu":
        rows = max(1, _CPU_BLOCK_ELEMENTS // max(length, 1))
    else:
        rows = max(batch, 1)
    bits_dtype = torch.int32 if dtype == torch.float32 else torch.int64
    for start in range(0, batch, rows):
        block = slice(start, start + rows)
        keep = mask[block].to(bits_dtype).neg_()  # all bits set on valid tokens, 0 on padding
        v = _select(values[block].to(dtype), keep)
        delta = _select(rewards[block].to(dtype), keep)
        delta.sub_(v)  # r_t − V_t
        # V_{t+1} is read from the masked values, so V_{L_b} = 0 after the last valid token.
        delta[:, :-1].add_(v[:, 1:], alpha=gamma)  # δ_t = r_t + γ·V_{t+1} − V_t
        adv = _reverse_discounted_cumsum(delta, levels, block)  # A_t = δ_t + γλ·A_{t+1}
        # δ = 0 past L_b already makes A = 0 there; the select also zeroes non-prefix holes.
        if out_dtype == dtype:  # write straight into the outputs: no block-sized temporaries
            torch.bitwise_and(adv.view(bits_dtype), keep, out=advantages[block].view(bits_dtype))
            torch.add(advantages[block], v, out=returns[block])  # returns_t = A_t + V_t
        else:
            adv = _select(adv, keep)
            advantages[block] = adv
            returns[block] = adv + v  # returns_t = A_t + V_t
    return advantages, returns


def _gae_on_cpu(
    kernel,
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    coef: Tensor,
    gamma: float,
    dtype: torch.dtype,
    advantages: Tensor,
    returns: Tensor,
) -> None:
    """Runs the compiled CPU scan (`gae_cpu.scan_kernel`) in `dtype` into advantages and returns.

    It runs on one thread: rows split over two Python threads (the kernel releases the GIL) lose to
    torch's OpenMP workers, which keep spinning on the second core for a while after torch's own
    parallel ops, and numba's parallel loops use an OpenMP layer that is not fork-safe
    (docs/benchmarks.md#gae).

    Inputs are converted to `dtype` and made contiguous only where they are not already; outputs
    of another dtype or layout are written through a temporary.
    """
    batch = values.shape[0]
    rewards = rewards.to(dtype).contiguous()
    values = values.to(dtype).contiguous()
    coef = coef.expand(batch).contiguous()  # γλ per row
    direct = [t.dtype == dtype and t.is_contiguous() for t in (advantages, returns)]
    adv = advantages if direct[0] else torch.empty_like(values)
    ret = returns if direct[1] else torch.empty_like(values)
    bad_row = kernel(
        rewards.numpy(),
        values.numpy(),
        mask.contiguous().numpy(),
        coef.numpy(),
        coef.numpy().dtype.type(gamma),
        adv.numpy(),
        ret.numpy(),
    )
    if bad_row >= 0:
        raise ValueError(
            f"response_mask row {bad_row} is not a prefix mask (a zero before a one): gae needs "
            "ones on each response's tokens, then zeros. Mask only the padding after the response."
        )
    if not direct[0]:
        advantages.copy_(adv)
    if not direct[1]:
        returns.copy_(ret)


def gae_reference(
    rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    lam: float | Tensor,
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """Returns `gae`'s (advantages, returns) by the plain reverse-time loop: the reference that the
    fast scans are tested against and the baseline they are timed against.

    The form RL-for-LLM frameworks use (verl's `compute_gae_advantage_return`): one Python
    iteration per time step over (B,) tensors.

    Args:
        rewards: token rewards r, shape (B, T).
        values: critic values V(s_t), shape (B, T).
        response_mask: (B, T) bool or float {0, 1} prefix mask.
        lam: λ, float or (B,) tensor.
        gamma: discount γ.

    Returns:
        (advantages, returns), each (B, T); 0 where the mask is 0. Garbage at padded positions
        must be finite (it is multiplied by the mask, not selected).
    """
    batch, length = values.shape
    mask = response_mask.to(values.dtype)
    discount = gamma * (lam.to(values.dtype) if isinstance(lam, Tensor) else lam)  # γλ
    last_advantage = torch.zeros(batch, dtype=values.dtype, device=values.device)
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    reversed_advantages = []
    for t in reversed(range(length)):
        m_t = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # δ_t = r_t + γ·V_{t+1} − V_t
        last_advantage = (delta + discount * last_advantage) * m_t  # A_t = δ_t + γλ·A_{t+1}
        next_value = values[:, t] * m_t  # V_{t+1} for step t − 1; 0 past the last valid token
        reversed_advantages.append(last_advantage)
    if reversed_advantages:
        advantages = torch.stack(reversed_advantages[::-1], dim=1)
    else:
        advantages = torch.zeros_like(values)
    return advantages, advantages + values * mask  # returns_t = A_t + V_t


def decoupled_gae(
    rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    lam_policy: float | Tensor,
    lam_critic: float | Tensor,
    gamma: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Policy advantages from λ_policy and critic returns from λ_critic (VAPO decoupled GAE).

    VC-PPO / VAPO train the critic on unbiased λ_critic = 1 Monte-Carlo returns while the policy
    uses a lower-variance λ_policy (fixed 0.95 or length-adaptive). This is two `gae` calls.

    Args:
        rewards: token rewards, shape (B, T).
        values: critic values V(s_t), shape (B, T).
        response_mask: (B, T) prefix mask, bool or float {0, 1}.
        lam_policy: λ_policy, float or (B,) tensor.
        lam_critic: λ_critic, float or (B,) tensor (the paper uses 1.0).
        gamma: discount γ.

    Returns:
        (advantages, returns), each (B, T): advantages of the λ_policy estimate, returns of the
        λ_critic estimate; 0 where the mask is 0.
    """
    advantages, _ = gae(rewards, values, response_mask, lam_policy, gamma)
    _, returns = gae(rewards, values, response_mask, lam_critic, gamma)
    return advantages, returns


def _select(x: Tensor, keep: Tensor) -> Tensor:
    """x where `keep` has all bits set and +0.0 where it is 0; any garbage (inf, nan) is dropped.

    Args:
        x: float32 or float64 tensor.
        keep: integer tensor of the same bit width (int32 or int64), −1 (all bits) or 0.

    Returns:
        A new tensor shaped like x, with x's dtype.
    """
    # A bitwise AND on the float's bits is an exact select. torch.where and masked_fill would do
    # the same but run much slower on CPU (docs/benchmarks.md#torch-scan-settings), and x·m would
    # turn inf garbage into nan.
    return (x.view(keep.dtype) & keep).view(x.dtype)


class _Level(NamedTuple):
    """One level of the chunked scan: chunk size K, n = ⌈T/K⌉ chunks and the discount terms."""

    chunk: int
    n_chunks: int
    pad: int
    matrix: Tensor  # D[k, i] = c^{k−i} for k ≥ i: (K, K), or (B, K, K) for per-row c
    decay: Tensor  # c^{K−i} for i = 0 .. K−1: (K,), or (B, K)


def _chunk_size(length: int) -> int:
    """Chunk size K for a scan of `length` steps: _CHUNK, or one chunk if T is shorter."""
    return max(1, min(_CHUNK, length))


def _discount_powers(coef: Tensor, count: int) -> Tensor:
    """Powers c^0 .. c^count of the discount c = γλ, shape (count + 1,) or (B, count + 1)."""
    exponents = torch.arange(count + 1, device=coef.device, dtype=coef.dtype)
    powers = coef.unsqueeze(-1) ** exponents  # c^e; torch gives 0^0 = 1, so λ = 0 works
    # Flush powers whose products with O(1) data would be subnormal: subnormal arithmetic takes
    # microcode assists on x86 (many times slower), and such terms are far below the resolution
    # of any O(1) sum.
    finfo = torch.finfo(coef.dtype)
    return torch.where(powers < finfo.tiny / finfo.eps, torch.zeros_like(powers), powers)


def _discount_matrix(powers: Tensor, chunk: int) -> Tensor:
    """Upper-triangular Toeplitz matrix D[k, i] = c^{k−i} for k ≥ i, else 0: (K, K) or (B, K, K).

    `local = x @ D` gives local_i = Σ_{k≥i} c^{k−i}·x_k within a chunk of K steps.
    """
    leading = powers.shape[:-1]
    # q = [c^{K−1}, ..., c^1, c^0, 0, ..., 0]; H[u, i] = q[u + i] is a strided (Hankel) view and
    # D[k, i] = H[K−1−k, i] = c^{k−i} (0 where k < i). A strided view plus one flip is several
    # times faster than gathering B·K² entries by index.
    q = torch.cat([powers[..., :chunk].flip(-1), powers.new_zeros(*leading, chunk - 1)], dim=-1)
    size = (*leading, chunk, chunk)
    stride = (*q.stride()[:-1], 1, 1)
    return q.as_strided(size, stride).flip(-2)


def _scan_plan(length: int, coef: Tensor) -> list[_Level]:
    """Levels of the chunked scan of `length` steps with discount `coef` (0-dim or (B,)).

    Level 0 scans the T steps in chunks of K_0; level 1 scans the ⌈T/K_0⌉ chunk starts with
    discount c^{K_0}; and so on until one chunk covers a level: O(log_K T) levels.
    """
    levels = []
    while True:
        chunk = _chunk_size(length)
        n_chunks = -(-length // chunk)
        powers = _discount_powers(coef, chunk)  # c^0 .. c^K
        decay = powers[..., 1:].flip(-1)  # c^{K−i} for i = 0 .. K−1
        matrix = _discount_matrix(powers, chunk)
        levels.append(_Level(chunk, n_chunks, n_chunks * chunk - length, matrix, decay))
        if n_chunks == 1:
            return levels
        coef, length = powers[..., chunk], n_chunks  # the chunk starts decay by c^K per chunk


def _reverse_discounted_cumsum(x: Tensor, levels: list[_Level], rows: slice) -> Tensor:
    """Reverse discounted cumulative sum y_t = x_t + c·y_{t+1}, y_T = 0, without a loop over t.

    Chunked scan: split T into n = ⌈T/K⌉ chunks of K steps (zero-padded at the end, which does not
    change y). Within chunk j, local_{j,i} = Σ_{k≥i} c^{k−i}·x_{j,k} is one batched matmul with the
    Toeplitz matrix D. The chunk starts S_j = y_{j,0} obey the same recursion at length n,
    S_j = local_{j,0} + c^K·S_{j+1}, solved by recursing on the next level (log_K T levels);
    then y_{j,i} = local_{j,i} + c^{K−i}·S_{j+1}.

    Args:
        x: (b, T) terms to accumulate, float32 or float64; rows `rows` of the planned batch.
        levels: the plan from `_scan_plan` for T and the whole batch's discount.
        rows: which rows of the plan's per-row discounts x holds (ignored for a shared one).

    Returns:
        y, shape (b, T), the same dtype as x.
    """
    level, rest = levels[0], levels[1:]
    batch, length = x.shape
    chunk, n_chunks = level.chunk, level.n_chunks
    if level.pad:
        x = F.pad(x, (0, level.pad))  # zeros after the end leave y unchanged
    if level.matrix.dim() == 3:  # one discount per row
        matrix, decay = level.matrix[rows], level.decay[rows].unsqueeze(1)
        local = torch.bmm(x.view(batch, n_chunks, chunk), matrix)  # local = x_chunk @ D_b
    else:
        matrix, decay = level.matrix, level.decay
        local = (x.view(batch * n_chunks, chunk) @ matrix).view(batch, n_chunks, chunk)
    if rest:
        # S_j = local_{j,0} + c^K·S_{j+1}: the same scan, T/K long, discount c^K.
        carries = _reverse_discounted_cumsum(local[:, :, 0].contiguous(), rest, rows)
        # y_{j,i} = local_{j,i} + c^{K−i}·S_{j+1}; the last chunk has no successor (S_n = 0).
        local[:, :-1].addcmul_(carries[:, 1:].unsqueeze(-1), decay)
    y = local.view(batch, n_chunks * chunk)
    return y[:, :length] if level.pad else y
