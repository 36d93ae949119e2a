"""GAE's reverse scan on CPU as one compiled loop per response (numba), near the memory floor.

It reads the inputs and writes the outputs once per response, with the backward recursion taken
four tokens at a time so the dependency chain is one fused multiply-add per four tokens
(docs/training.md#the-maths-vapo_labalgo). Compiled on first use, never cached on disk (numba's
cache is a pickle); None without numba, and `gae` then uses its torch scan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

try:
    import numpy as np  # numba's kernels see module globals; numpy comes with numba
except ImportError:  # then numba is missing too and scan_kernel() is None
    np = None


@functools.cache
def scan_kernel() -> Callable | None:
    """The compiled GAE kernel, or None when numba cannot be imported (gae falls back to torch).

    The kernel is ``kernel(r, v, m, c, gamma, adv, ret) -> int`` over NumPy views of contiguous
    CPU tensors: r, v (B, T) float32 or float64; m (B, T) bool; c (B,) the discount γλ per row;
    gamma a scalar of r's dtype; adv, ret (B, T) outputs of r's dtype. It returns the first row
    whose mask is not a prefix (ones, then zeros), or −1; rows after a hole are still computed
    over their leading prefix, and the caller raises.
    """
    try:
        import numba
    except ImportError:  # a speed-up only: gae's torch scan gives the same results to rounding
        return None

    @numba.njit(boundscheck=False, fastmath={"contract"}, nogil=True)
    def kernel(r, v, m, c, gamma, adv, ret):  # pragma: no cover (compiled; tested through gae)
        batch, length = r.shape
        zero = r.dtype.type(0)
        delta = np.empty(length, r.dtype)
        bad_row = -1
        for b in range(batch):
            rr, vv, mm, aa, re = r[b], v[b], m[b], adv[b], ret[b]
            end = 0  # L_b: the mask's leading run of ones
            while end < length and mm[end]:
                end += 1
            hole = False  # a one after the first zero: not a prefix mask
            for t in range(end, length):
                hole |= mm[t]
            if hole and bad_row < 0:
                bad_row = b
            aa[end:] = zero
            re[end:] = zero
            if end == 0:
                continue
            for t in range(end - 1):
                delta[t] = rr[t] + gamma * vv[t + 1] - vv[t]  # δ_t = r_t + γ·V_{t+1} − V_t
            delta[end - 1] = rr[end - 1] - vv[end - 1]  # V_L = 0 after the last valid token
            c1 = c[b]
            c4 = (c1 * c1) * (c1 * c1)
            a = zero  # A_{t+1}
            t = end - 1
            while t >= 0 and (t + 1) % 4 != 0:  # single steps until t + 1 is a multiple of 4
                a = delta[t] + c1 * a
                aa[t] = a
                t -= 1
            while t >= 3:  # four steps: the chain runs through a only, once per four tokens
                d3 = delta[t]
                d2 = delta[t - 1]
                d1 = delta[t - 2]
                d0 = delta[t - 3]
                a3 = d3 + c1 * a
                a2 = d2 + c1 * a3
                a1 = d1 + c1 * a2
                a = (d0 + c1 * (d1 + c1 * (d2 + c1 * d3))) + c4 * a
                aa[t] = a3
                aa[t - 1] = a2
                aa[t - 2] = a1
                aa[t - 3] = a
                t -= 4
            for t in range(end):
                re[t] = aa[t] + vv[t]  # returns_t = A_t + V_t
        return bad_row

    return kernel
