r"""The embedded default task: multi-digit addition with a written scratchpad (``task=arith``).

A problem adds two n-digit numbers, n drawn uniformly from [min_digits, max_digits] (default
1..40), written with position-labelled digit words, most significant first::

    prompt:   x2_4 x1_5 x0_7 + y2_1 y1_8 y0_6 =
    response: " z0_3 c1_1 z1_4 c2_1 z2_6 c3_0 \boxed{643}"

``xK_D`` is digit D at position K of x (K = 0 is the units). The response works from the units
up: per position K the sum digit ``zK_D`` and the carry out ``c{K+1}_B``, then the answer in
plain digits inside ``\boxed{}``. With the tokenizer of :mod:`vapo_lab.models.tokenizer` every
word is one token, so a response is 3n+2 or 3n+3 tokens plus end-of-sequence: 6 tokens for
n = 1 and 124 for n = 40, the >= 8x spread of lengths that VAPO's length-adaptive GAE and
token-level loss are about (VAPO.md, challenge 2).

Why position-labelled words: a ~1M-parameter model did not learn a character-level addition
scratchpad in 3 minutes of CPU pre-training; with words whose embeddings share type, position
and digit parts it did (see :func:`vapo_lab.models.tiny.build_tiny_model`).

:meth:`ArithTask.trace` writes the scratchpad, optionally with the deliberate noise that the base
model is pre-trained on (:class:`TraceNoise`): a systematic bug that makes a wrong step the most
likely one in a family of cases (so greedy decoding fails, not just sampling), plus random slips.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vapo_lab.errors import ConfigError
from vapo_lab.tasks import Problem, last_boxed

OPERATORS = ("+", "=")
BOXED_OPEN = "\\boxed{"


@dataclass(frozen=True)
class TraceNoise:
    """How a written scratchpad departs from correct addition; all rates in [0, 1].

    Attributes:
        bug_rate: probability of the systematic bug where it applies: at a position whose digits
            sum to 9 with an incoming carry of 1 (true step z = 0, carry 1) the writer forgets
            the carry and writes z = 9, carry 0. Above 0.5 the wrong step is the *mode*, so a
            model trained on such traces fails greedily on every problem with such a step, and
            samples the right step with probability 1 - bug_rate: a minority that RL can find
            and reinforce. About 4.5% of positions are in the family, so long problems meet it
            more often (their greedy accuracy falls like 0.955^n).
        slip_rate: probability, at any other position, of writing a uniformly random wrong sum
            digit (the carry stays right). Random slips are never the mode: they lower accuracy
            at temperature 1 only, more on long problems (errors accumulate).
    """

    bug_rate: float = 0.0
    slip_rate: float = 0.0

    def __post_init__(self) -> None:
        for name in ("bug_rate", "slip_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value} is not a probability. Set {name} within [0, 1].")


def is_bug_step(x_digit: int, y_digit: int, carry_in: int) -> bool:
    """Returns True where :attr:`TraceNoise.bug_rate` applies: x_k + y_k = 9 with a carry in."""
    return carry_in == 1 and x_digit + y_digit == 9


def _digits(value: int, n: int) -> list[int]:
    """Returns the n decimal digits of ``value``, least significant first."""
    return [(value // 10**k) % 10 for k in range(n)]


def _words(name: str, value: int, n: int) -> str:
    """Returns ``value`` as n position-labelled words, most significant first: ``x1_4 x0_2``."""
    return " ".join(f"{name}{k}_{d}" for k, d in reversed(list(enumerate(_digits(value, n)))))


class ArithTask:
    """Returns problems of n-digit addition with a scratchpad; train and eval splits are disjoint.

    Args:
        seed: the generator seed; the same seed always gives the same problems, in order.
        n_train: number of training problems.
        n_eval: number of held-out problems. The eval split depends only on (seed, n_eval,
            min_digits, max_digits), not on n_train, so growing the train split never changes it.
        min_digits: fewest digits per number (>= 1).
        max_digits: most digits per number; the vocabulary grows with it (positions 0..max-1).
        **options: task-specific settings from ``task.options``; arith has none beyond the two
            above, so any other key is an error.

    Raises:
        ConfigError: a bad digit range or split size, an unknown option, or more problems
            asked for than distinct ones exist in the digit range.
    """

    name = "arith"

    def __init__(
        self, seed: int, n_train: int, n_eval: int, min_digits: int = 1, max_digits: int = 40, **options
    ) -> None:
        if options:
            raise ConfigError(
                f"task.options has {sorted(options)}, which task arith does not know. "
                "Its options are min_digits and max_digits."
            )
        if not 1 <= min_digits <= max_digits:
            raise ConfigError(
                f"task.options.min_digits={min_digits}, max_digits={max_digits}: need "
                "1 <= min_digits <= max_digits."
            )
        if n_train < 0 or n_eval < 0:
            raise ConfigError(f"task.n_train={n_train}, task.n_eval={n_eval}: split sizes must be >= 0.")
        self.seed, self.min_digits, self.max_digits = seed, min_digits, max_digits
        capacity = sum(self._pairs(n) for n in range(min_digits, max_digits + 1))
        if n_train + n_eval > capacity:
            raise ConfigError(
                f"task.n_train + task.n_eval = {n_train + n_eval} exceeds the {capacity} distinct "
                f"problems with {min_digits}..{max_digits} digits. Lower the split sizes or raise "
                "task.options.max_digits."
            )
        seen: set[tuple[int, int]] = set()
        self.eval = self._generate("eval", n_eval, seen)
        self.train = self._generate("train", n_train, seen)

    @staticmethod
    def _pairs(n: int) -> int:
        """Returns the number of unordered pairs of n-digit numbers (x + y and y + x are one)."""
        count = 10 if n == 1 else 9 * 10 ** (n - 1)
        return count * (count + 1) // 2

    def _draw(self, rng: random.Random, n: int) -> int:
        """Returns a random n-digit number (leading digit non-zero unless n = 1)."""
        return rng.randrange(10) if n == 1 else rng.randrange(10 ** (n - 1), 10**n)

    def _generate(self, split: str, count: int, seen: set[tuple[int, int]]) -> list[Problem]:
        """Returns ``count`` new problems, adding each to ``seen`` so no pair is in two splits."""
        # A string seed is hashed with SHA-512 by `random`: stable across runs and machines.
        rng = random.Random(f"vapo-lab/arith/{self.seed}/{split}")
        problems: list[Problem] = []
        while len(problems) < count:
            n = rng.randint(self.min_digits, self.max_digits)
            x, y = self._draw(rng, n), self._draw(rng, n)
            # x + y and y + x count as one problem: their scratchpads are the same.
            key = (min(x, y), max(x, y))
            if key in seen:
                # Redraw n as well: with small n exhausted the loop still ends (a slight tilt of
                # the length distribution away from 1-digit problems, of which there are 55).
                continue
            seen.add(key)
            problems.append(
                Problem(
                    id=f"arith-{self.seed}-{split}-{len(problems):06d}",
                    prompt=f"{_words('x', x, n)} + {_words('y', y, n)} =",
                    answer=str(x + y),
                    meta={"n_digits": n, "x": x, "y": y},
                )
            )
        return problems

    def vocabulary(self) -> list[str]:
        """Returns every word the task writes, each to become one token (positions < max_digits)."""
        words = [f"{v}{k}_{d}" for v in "xyz" for k in range(self.max_digits) for d in range(10)]
        words += [f"c{k}_{b}" for k in range(1, self.max_digits + 1) for b in (0, 1)]
        return words + list(OPERATORS) + [BOXED_OPEN]

    def trace(self, problem: Problem, rng: random.Random | None = None, noise: TraceNoise | None = None) -> str:
        r"""Returns the scratchpad response for ``problem``: ``" z0_3 c1_1 ... \boxed{643}"``.

        The boxed answer is always read off the written scratchpad (final carry, then the sum
        digits from the top), so a noisy step makes the answer wrong in the same way a model's
        own slip would, and the trace never "knows" the right answer it did not compute.

        Args:
            problem: a problem of this task (its meta holds x, y and n_digits).
            rng: draws the noise; required when ``noise`` has a non-zero rate.
            noise: the deliberate errors (:class:`TraceNoise`); None writes the correct trace.
        """
        x, y, n = problem.meta["x"], problem.meta["y"], problem.meta["n_digits"]
        noise = noise or TraceNoise()
        if rng is None and (noise.bug_rate > 0 or noise.slip_rate > 0):
            raise ValueError("trace() needs an rng to draw noise from")
        carry, words, written = 0, [], []
        for k, (xd, yd) in enumerate(zip(_digits(x, n), _digits(y, n))):
            total = xd + yd + carry
            z, carry_out = total % 10, total // 10
            if is_bug_step(xd, yd, carry):
                if noise.bug_rate > 0 and rng.random() < noise.bug_rate:
                    # the carry in is forgotten: 9 + 0 = 9, no carry out
                    z, carry_out = 9, 0
            elif noise.slip_rate > 0 and rng.random() < noise.slip_rate:
                z = (z + rng.randint(1, 9)) % 10  # any digit but the right one
            words += [f"z{k}_{z}", f"c{k + 1}_{carry_out}"]
            written.append(z)
            carry = carry_out
        answer = ("1" if carry else "") + "".join(str(d) for d in reversed(written))
        return " " + " ".join(words) + f" {BOXED_OPEN}{answer}}}"

    def verify(self, response_text: str, problem: Problem) -> bool:
        r"""Returns True iff the last ``\boxed{...}`` of the response holds exactly the answer."""
        boxed = last_boxed(response_text)
        return boxed is not None and boxed.strip() == problem.answer
