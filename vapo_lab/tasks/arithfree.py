r"""Free-length addition (``task=arithfree``): the policy chooses how much of the scratchpad to
write.

The problem is :mod:`vapo_lab.tasks.arith`'s n-digit addition in position-labelled words, with two
changes: the numbers may have leading zeros (``x1_0`` occurs at every n, so no digit/column
combination is seen only in 1-digit problems, the tokenisation hole of ``task=arith``), and the
response's length is the policy's choice. It works the columns from the units up, as ``arith``'s
scratchpad does, and may stop after any column and box its answer; the columns it did not work
out it *guesses* by adding each column's two digits and dropping every carry between columns::

    prompt:     x1_4 x2_5 x3_7 + y1_1 y2_8 y3_6 =                         (457 + 186 = 643)
    full:       " c3_0 z3_3 c2_1 z2_4 c1_1 z1_6 c0_0 \boxed{ r1_6 r2_4 r3_3 }"   13 tokens, right
    1 column:   " c3_0 z3_3 c2_1 \boxed{ r1_5 r2_3 r3_3 }"                  9 tokens, wrong
    direct:     " \boxed{ r1_5 r2_3 r3_3 }"                                  5 tokens, wrong

The answer is read out in labelled words ``rK_D`` (``r0_1`` first when the sum has a final carry):
a worked column K is copied from its ``zK`` word, a guessed one is (x_K + y_K) mod 10, and the
guessed top column's overflow is the final carry. A guess is right exactly when no carry crosses
into a guessed column, so the direct answer is always right on 1-digit problems, right on about
55% of 2-digit ones and almost never on 10-digit ones: **the length needed differs by problem**
(:meth:`ArithFreeTask.min_columns`), from 3 tokens to 3n + 4 (100 at n = 32), and longer
reasoning is more accurate (the guess never beats the worked column). The verifier reads only
the last ``\boxed{}``: the reward stays a single terminal 1/0.

Why this design (docs/cpu-task-design.md): in ``task=arith`` the length of a response is fixed by
its problem, so nothing that VAPO's critic components guard against (a biased value model pushing
the policy towards short, wrong answers: value-pretraining, decoupled GAE) can happen. Here every
"continue or stop" decision sits early in a long response and its consequence comes only at the
end, which is what a reward-model-initialised critic and GAE's λ < 1 get wrong.

The base model is pre-trained on a mixture of lengths (:class:`LengthChoice`): it often answers
directly or stops early, and its worked columns carry ``arith``'s systematic bug and slips
(:class:`~vapo_lab.tasks.arith.TraceNoise`); see :mod:`vapo_lab.basemodel.freerecipe`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from vapo_lab.errors import ConfigError
from vapo_lab.tasks import Problem, last_boxed
from vapo_lab.tasks.arith import BOXED_OPEN, OPERATORS, TraceNoise, is_bug_step

# Lower edges of the default digit-count strata of the held-out report (1-3, 4-8, 9-16, 17+ digits)
DEFAULT_STRATA = (1, 4, 9, 17)
# The response modes :meth:`ArithFreeTask.classify` tells apart
MODES = ("direct", "partial", "full", "other")


@dataclass(frozen=True)
class LengthChoice:
    """How many scratchpad columns a pre-training trace works before it boxes its answer.

    Attributes:
        direct_rate: probability of answering at once (no scratchpad, every column guessed).
        stop_rate: otherwise, after each worked column but the last, the probability of stopping
            there (so a trace works m columns with probability ~ (1 - stop_rate)^(m-1)).
    """

    direct_rate: float = 0.0
    stop_rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("direct_rate", "stop_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value} is not a probability. Set {name} within [0, 1].")

    def draw(self, n_digits: int, rng: random.Random) -> int:
        """Returns the number of columns (0..n_digits) a trace of an n-digit problem works out."""
        if self.direct_rate > 0 and rng.random() < self.direct_rate:
            return 0
        columns = 1
        while columns < n_digits and not (self.stop_rate > 0 and rng.random() < self.stop_rate):
            columns += 1
        return columns


def digits(value: int, n: int) -> list[int]:
    """Returns the n decimal digits of ``value`` (leading zeros kept), column 1 (leftmost) first."""
    return [int(ch) for ch in str(value).zfill(n)]


def words(name: str, value: int, n: int) -> str:
    """Returns ``value`` as n position-labelled words, column 1 first: ``x1_0 x2_4``."""
    return " ".join(f"{name}{column}_{d}" for column, d in enumerate(digits(value, n), start=1))


def answer_words(x: int, y: int, n: int) -> list[str]:
    """Returns the labelled words of the true sum: ``r0_1`` when it overflows n digits, then
    r1..rn."""
    total = x + y
    carry = ["r0_1"] if total >= 10**n else []
    return carry + [f"r{c}_{d}" for c, d in enumerate(digits(total % 10**n, n), start=1)]


def guess_is_right(x: int, y: int, n: int, columns: int) -> bool:
    """Returns True when working the lowest ``columns`` columns and guessing the rest gives the sum.

    The guess drops every carry into a guessed column, so it is right exactly when none crosses
    into one: the carry out of the last worked column is 0 and no guessed column but the top one
    overflows (x_K + y_K >= 10 for K >= 2). Worked columns are assumed right.
    """
    guessed = n - columns
    if guessed <= 0:
        return True
    xs, ys = digits(x, n), digits(y, n)
    carry = 0
    for k in range(n, guessed, -1):  # the worked columns, units first
        carry = (xs[k - 1] + ys[k - 1] + carry) // 10
    if carry:
        return False
    return all(xs[k - 1] + ys[k - 1] <= 9 for k in range(2, guessed + 1))


class ArithFreeTask:
    """Free-length n-digit addition: train and eval splits, verifier, trace writer and strata.

    Args:
        seed: the generator seed; the same seed always gives the same problems, in order.
        n_train, n_eval: split sizes. The eval split depends only on (seed, n_eval, the digit
            options), not on n_train.
        min_digits, max_digits: the digit-count range (every number has exactly n digits,
            leading zeros allowed).
        length_exponent: P(n) ∝ n^-length_exponent (0: uniform).
        strata: lower edges of the digit-count strata the held-out report is split by
            (:meth:`stratum`); the first must be <= min_digits.
        train_path, eval_path, problem_key, answer_key, prompt_template: accepted because the
            trainer passes them to every task but ``arith``; they must be unset (None) or the
            defaults, since the problems are generated.

    Raises:
        ConfigError: bad digit range, split sizes, strata, an unknown option, or more problems
            asked for than exist.
    """

    name = "arithfree"

    def __init__(
        self,
        seed: int,
        n_train: int,
        n_eval: int,
        min_digits: int = 1,
        max_digits: int = 32,
        length_exponent: float = 0.5,
        strata: list[int] | tuple[int, ...] = DEFAULT_STRATA,
        train_path: str | None = None,
        eval_path: str | None = None,
        problem_key: str = "problem",
        answer_key: str = "answer",
        prompt_template: str = "{problem}",
        **options: Any,
    ) -> None:
        if options:
            raise ConfigError(
                f"task.options has {sorted(options)}, which task arithfree does not know. "
                "Its options are min_digits, max_digits, length_exponent and strata."
            )
        if train_path is not None or eval_path is not None:
            raise ConfigError(
                "task=arithfree generates its problems: leave task.train_path and "
                "task.eval_path unset"
            )
        if not 1 <= min_digits <= max_digits:
            raise ConfigError(
                f"task.options.min_digits={min_digits}, max_digits={max_digits}: need "
                "1 <= min_digits <= max_digits."
            )
        if length_exponent < 0:
            raise ConfigError(
                f"task.options.length_exponent={length_exponent} is negative. Set it >= 0."
            )
        if n_train < 0 or n_eval < 0:
            raise ConfigError(
                f"task.n_train={n_train}, task.n_eval={n_eval}: split sizes must be >= 0."
            )
        edges = tuple(int(e) for e in strata)
        if not edges or list(edges) != sorted(set(edges)) or edges[0] > min_digits:
            raise ConfigError(
                f"task.options.strata={list(edges)}: give increasing lower edges, the first "
                f"<= min_digits={min_digits}, e.g. {list(DEFAULT_STRATA)}"
            )
        self.seed, self.min_digits, self.max_digits, self.strata = (
            seed,
            min_digits,
            max_digits,
            edges,
        )
        self.digit_counts = list(range(min_digits, max_digits + 1))
        self.length_weights = [n**-length_exponent for n in self.digit_counts]
        capacity = sum(self._pairs(n) for n in self.digit_counts)
        if n_train + n_eval > capacity:
            raise ConfigError(
                f"task.n_train + task.n_eval = {n_train + n_eval} exceeds the {capacity} distinct "
                "problems in the digit range. Lower the split sizes or raise max_digits."
            )
        seen: set[tuple[int, int, int]] = set()
        self.eval = self._generate("eval", n_eval, seen)
        self.train = self._generate("train", n_train, seen)

    @staticmethod
    def _pairs(n: int) -> int:
        """Returns the number of unordered pairs of n-digit strings (leading zeros allowed)."""
        count = 10**n
        return count * (count + 1) // 2

    def _generate(self, split: str, count: int, seen: set[tuple[int, int, int]]) -> list[Problem]:
        """Returns ``count`` new problems; ``seen`` keeps the splits disjoint (x + y and y + x are
        one)."""
        rng = random.Random(f"vapo-lab/arithfree/{self.seed}/{split}")
        problems: list[Problem] = []
        while len(problems) < count:
            n = rng.choices(self.digit_counts, weights=self.length_weights)[0]
            x, y = rng.randrange(10**n), rng.randrange(10**n)
            key = (n, min(x, y), max(x, y))
            if key in seen:
                continue  # redraw n too (1-digit problems run out: there are 55)
            seen.add(key)
            problems.append(
                Problem(
                    id=f"arithfree-{self.seed}-{split}-{len(problems):06d}",
                    prompt=f"{words('x', x, n)} + {words('y', y, n)} =",
                    answer=" ".join(answer_words(x, y, n)),
                    meta={"n_digits": n, "x": x, "y": y},
                )
            )
        return problems

    def vocabulary(self) -> list[str]:
        """Returns every word the task writes (columns 1..max_digits), each to become one token."""
        m = self.max_digits
        vocab = [f"{v}{k}_{d}" for v in "xyz" for k in range(1, m + 1) for d in range(10)]
        vocab += [f"c{k}_{b}" for k in range(m + 1) for b in (0, 1)]
        vocab += ["r0_1"] + [f"r{k}_{d}" for k in range(1, m + 1) for d in range(10)] + ["}"]
        return vocab + list(OPERATORS) + [BOXED_OPEN]

    def trace(
        self,
        problem: Problem,
        rng: random.Random | None = None,
        noise: TraceNoise | None = None,
        columns: int | None = None,
    ) -> str:
        r"""Returns a response that works the lowest ``columns`` columns (None: all) and guesses the
        rest.

        Worked columns follow ``arith``'s scratchpad, with ``noise`` (its systematic bug and slips;
        None: none); the boxed answer copies the worked columns' written sum digits (so a noisy
        step makes the answer wrong the way a model's own slip would) and guesses the others as
        (x_K + y_K) mod 10, the guessed top column's overflow as ``r0_1``.

        Raises:
            ValueError: ``columns`` outside 0..n, or noise without an ``rng``.
        """
        x, y, n = problem.meta["x"], problem.meta["y"], problem.meta["n_digits"]
        columns = n if columns is None else columns
        if not 0 <= columns <= n:
            raise ValueError(f"columns={columns} is outside 0..{n}")
        noise = noise or TraceNoise()
        if rng is None and (noise.bug_rate > 0 or noise.slip_rate > 0):
            raise ValueError("trace() needs an rng to draw noise from")
        xs, ys = digits(x, n), digits(y, n)
        written: dict[int, int] = {}
        out: list[str] = []
        carry = 0
        if columns:
            out.append(f"c{n}_0")
            for column in range(n, n - columns, -1):
                xd, yd = xs[column - 1], ys[column - 1]
                total = xd + yd + carry
                z, carry_out = total % 10, total // 10
                if is_bug_step(xd, yd, carry, noise.bug_sums):
                    if noise.bug_rate > 0 and rng.random() < noise.bug_rate:
                        z, carry_out = (xd + yd) % 10, (xd + yd) // 10
                elif noise.slip_rate > 0 and rng.random() < noise.slip_rate:
                    z = (z + rng.randint(1, 9)) % 10
                out += [f"z{column}_{z}", f"c{column - 1}_{carry_out}"]
                written[column] = z
                carry = carry_out
        guessed = n - columns
        for column in range(1, guessed + 1):
            written[column] = (xs[column - 1] + ys[column - 1]) % 10
        final = (xs[0] + ys[0] >= 10) if guessed else bool(carry)
        readout = (["r0_1"] if final else []) + [f"r{c}_{written[c]}" for c in range(1, n + 1)]
        return " " + " ".join(out + [BOXED_OPEN] + readout + ["}"])

    def verify(self, response_text: str, problem: Problem) -> bool:
        r"""Returns True iff the last ``\boxed{...}`` holds exactly the labelled words of the
        sum."""
        boxed = last_boxed(response_text)
        return boxed is not None and boxed.split() == problem.answer.split()

    def min_columns(self, problem: Problem) -> int:
        """Returns the fewest worked columns whose guessed rest is right: 0 when the direct answer
        is."""
        x, y, n = problem.meta["x"], problem.meta["y"], problem.meta["n_digits"]
        return next(m for m in range(n + 1) if guess_is_right(x, y, n, m))

    def stratum(self, problem: Problem) -> str:
        """Returns the digit-count stratum of ``problem``, e.g. ``"d04_08"`` (``"d17_up"`` for the
        last)."""
        return stratum_label(problem.meta["n_digits"], self.strata, self.max_digits)

    def classify(self, response_text: str, problem: Problem) -> tuple[str, int]:
        """Returns (mode, worked columns) of a response: "direct" (boxed at once), "partial"
        (stopped before the top column), "full" (every column worked) or "other" (anything else,
        e.g. no box); worked columns count the ``zK`` words before the box."""
        n = problem.meta["n_digits"]
        head, sep, _ = response_text.partition(BOXED_OPEN)
        worked = sum(1 for w in head.split() if w.startswith("z"))
        if not sep:
            return "other", worked
        if not head.strip():
            return "direct", 0
        return ("full" if worked >= n else "partial"), worked


def stratum_label(
    n_digits: int, edges: tuple[int, ...] = DEFAULT_STRATA, max_digits: int | None = None
) -> str:
    """Returns the label of the stratum holding ``n_digits`` under lower ``edges``: ``"d01_03"``,
    ``"d17_32"`` (or ``"d17_up"`` without ``max_digits``); digit counts below edges[0] go to the
    first."""
    i = max([j for j, e in enumerate(edges) if e <= n_digits], default=0)
    lo = edges[i]
    if i + 1 < len(edges):
        return f"d{lo:02d}_{edges[i + 1] - 1:02d}"
    return f"d{lo:02d}_{max_digits:02d}" if max_digits is not None else f"d{lo:02d}_up"
