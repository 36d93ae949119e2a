r"""The embedded default task: multi-digit addition with a written scratchpad (``task=arith``).

A problem adds two n-digit numbers, n drawn from [min_digits, max_digits] (default 1..40,
P(n) ∝ n^-0.75), written with position-labelled digit words; positions count from the left, so the
most significant column is 1 and the units column is n::

    prompt:   x1_4 x2_5 x3_7 + y1_1 y2_8 y3_6 =
    response: " c3_0 z3_3 c2_1 z2_4 c1_1 z1_6 c0_0 \boxed{643}"

``xK_D`` is digit D in column K of x. The response works from the units column (K = n) to the
left: it opens with the carry into the units (``c{n}_0``), then per column K the sum digit
``zK_D`` and the carry ``c{K-1}_B`` into the next column, ``c0`` being the carry out of the top;
then the answer in plain digits inside ``\boxed{}``: the final carry if 1, then z1 .. zn. With
the tokenizer of :mod:`vapo_lab.models.tokenizer` every word is one token, so a response is
3n+3 or 3n+4 tokens plus end-of-sequence: 7 for n = 1 and 125 for n = 40, the >= 8x spread of
lengths that VAPO's length-adaptive GAE and token-level loss are about (VAPO.md, challenge 2).
Why words, and why labels count from the left: docs/default-task.md, The task and the model.

:meth:`ArithTask.trace` writes the scratchpad, optionally with the deliberate noise the base
model is pre-trained on (:class:`TraceNoise`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vapo_lab.errors import ConfigError
from vapo_lab.tasks import Problem, last_boxed

OPERATORS = ("+", "=")
BOXED_OPEN = "\\boxed{"
# How the boxed answer is written: plain digits, or one position-labelled word per digit
READOUTS = ("plain", "labelled")


@dataclass(frozen=True)
class TraceNoise:
    """How a written scratchpad departs from correct addition; all rates in [0, 1].

    Attributes:
        bug_rate: probability of the systematic bug where it applies (``bug_sums``): the writer
            forgets the carry in, e.g. 4 + 5 (+1) written as z = 9, carry 0. Above 0.5 the wrong
            step is the *mode*, so a model trained on such traces fails greedily and samples the
            right step with probability 1 - bug_rate: a minority RL can find and reinforce.
        slip_rate: probability, in any other column, of a uniformly random wrong sum digit (the
            carry stays right); never the mode, so slips lower accuracy at temperature 1 only.
        bug_sums: the digit sums x_k + y_k at which, with a carry in, the bug applies: (9,) is
            about 4.5% of columns; (9, ..., 18), every overflowing column, about 25%.
    """

    bug_rate: float = 0.0
    slip_rate: float = 0.0
    bug_sums: tuple[int, ...] = (9,)

    def __post_init__(self) -> None:
        for name in ("bug_rate", "slip_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value} is not a probability. Set {name} within [0, 1].")
        object.__setattr__(self, "bug_sums", tuple(int(v) for v in self.bug_sums))
        if any(not 0 <= v <= 18 for v in self.bug_sums):
            raise ConfigError(
                f"bug_sums={list(self.bug_sums)}: a column's digit sum x + y is 0..18. "
                "Give sums within [0, 18], e.g. [9]."
            )


def is_bug_step(
    x_digit: int, y_digit: int, carry_in: int, bug_sums: tuple[int, ...] = (9,)
) -> bool:
    """Returns True where :attr:`TraceNoise.bug_rate` applies: a carry in, x_k + y_k in
    ``bug_sums``."""
    return carry_in == 1 and x_digit + y_digit in bug_sums


def _digits(value: int, n: int) -> list[int]:
    """Returns the n decimal digits of ``value``, most significant first (column 1 .. n)."""
    return [int(ch) for ch in str(value).zfill(n)]


def _words(name: str, value: int, n: int) -> str:
    """Returns ``value`` as n position-labelled words, column 1 (leftmost) first: ``x1_4 x2_2``."""
    return " ".join(f"{name}{column}_{d}" for column, d in enumerate(_digits(value, n), start=1))


def response_tokens(n_digits: int, final_carry: bool = False) -> int:
    r"""Returns the tokens of a correct response to an n-digit problem, end-of-sequence not counted.

    ``c{n}_0``, then ``zK cK-1`` per column (2n), ``\boxed{``, the answer's n digits (n + 1 with a
    final carry) and ``}``: 3n + 3, or 3n + 4 (one token a word, see the module docstring). The
    labelled read-out (``rK_D`` words, then `` }``) has the same count.
    """
    return 3 * n_digits + 3 + int(final_carry)


class ArithTask:
    """n-digit addition problems with a scratchpad, in disjoint train and eval splits.

    The same ``seed`` always gives the same problems, in order; the eval split depends only on
    (seed, n_eval, min_digits, max_digits), so growing the train split never changes it.

    Args:
        max_digits: most digits per number; the vocabulary grows with it (columns 1..max_digits).
        length_exponent: n is drawn with P(n) ∝ n^-length_exponent; 0 is uniform, the default
            0.75 a long tail of long problems (docs/default-task.md).
        readout: how the boxed answer is written: ``"plain"`` digits (``\boxed{643}``, the
            default) or ``"labelled"`` words (``\boxed{ r1_6 r2_4 r3_3 }``, the final carry as
            ``r0_1``), each carrying its column like the scratchpad's words.
        **options: any other ``task.options`` key, which is an error.

    Raises:
        ConfigError: a bad digit range or split size, an unknown option, or more problems
            asked for than distinct ones exist in the digit range.
    """

    name = "arith"

    def __init__(
        self,
        seed: int,
        n_train: int,
        n_eval: int,
        min_digits: int = 1,
        max_digits: int = 40,
        length_exponent: float = 0.75,
        readout: str = "plain",
        **options,
    ) -> None:
        if options:
            raise ConfigError(
                f"task.options has {sorted(options)}, which task arith does not know. "
                "Its options are min_digits, max_digits, length_exponent and readout."
            )
        if readout not in READOUTS:
            raise ConfigError(
                f"task.options.readout={readout!r} is not one of {list(READOUTS)}. "
                "Set task.options.readout=plain or labelled."
            )
        self.readout = readout
        if length_exponent < 0:
            raise ConfigError(
                f"task.options.length_exponent={length_exponent} is negative: P(n) ∝ n^-exponent "
                "would favour long problems. Set it >= 0 (0 is uniform)."
            )
        if not 1 <= min_digits <= max_digits:
            raise ConfigError(
                f"task.options.min_digits={min_digits}, max_digits={max_digits}: need "
                "1 <= min_digits <= max_digits."
            )
        if n_train < 0 or n_eval < 0:
            raise ConfigError(
                f"task.n_train={n_train}, task.n_eval={n_eval}: split sizes must be >= 0."
            )
        self.seed, self.min_digits, self.max_digits = seed, min_digits, max_digits
        self.digit_counts = list(range(min_digits, max_digits + 1))
        self.length_weights = [n**-length_exponent for n in self.digit_counts]
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
            n = rng.choices(self.digit_counts, weights=self.length_weights)[0]
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
        """Returns every word the task writes, each to become one token (columns 1..max_digits)."""
        words = [
            f"{v}{k}_{d}" for v in "xyz" for k in range(1, self.max_digits + 1) for d in range(10)
        ]
        words += [f"c{k}_{b}" for k in range(self.max_digits + 1) for b in (0, 1)]
        if self.readout == "labelled":
            # "}" too, so that the closing " }" is one token (a bare "}" is a byte token already)
            words += (
                ["r0_1"]
                + [f"r{k}_{d}" for k in range(1, self.max_digits + 1) for d in range(10)]
                + ["}"]
            )
        return words + list(OPERATORS) + [BOXED_OPEN]

    def trace(
        self, problem: Problem, rng: random.Random | None = None, noise: TraceNoise | None = None
    ) -> str:
        r"""Returns the scratchpad response for ``problem``: ``" c3_0 z3_3 c2_1 ... \boxed{643}"``.

        The boxed answer is always read off the written scratchpad (final carry, then the sum
        digits from the left), so a noisy step makes the answer wrong in the same way a model's
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
        # c{n}_0 (no carry into the units) opens the response, so that the word before every zK
        # is labelled K: the position-matching attention head of the tiny model (see
        # vapo_lab.models.tiny) then finds xK and yK from the first column on.
        carry, words, written = 0, [f"c{n}_0"], {}
        columns = list(zip(_digits(x, n), _digits(y, n)))
        for column in range(n, 0, -1):
            xd, yd = columns[column - 1]
            total = xd + yd + carry
            z, carry_out = total % 10, total // 10
            if is_bug_step(xd, yd, carry, noise.bug_sums):
                if noise.bug_rate > 0 and rng.random() < noise.bug_rate:
                    # the carry in is forgotten: 4 + 5 (+1) gives 9, no carry; 7 + 8 (+1) gives 5
                    z, carry_out = (xd + yd) % 10, (xd + yd) // 10
            elif noise.slip_rate > 0 and rng.random() < noise.slip_rate:
                z = (z + rng.randint(1, 9)) % 10  # any digit but the right one
            words += [f"z{column}_{z}", f"c{column - 1}_{carry_out}"]
            written[column] = z
            carry = carry_out
        answer = ("1" if carry else "") + "".join(str(written[c]) for c in range(1, n + 1))
        if self.readout == "labelled":
            labelled = (["r0_1"] if carry else []) + [f"r{c}_{written[c]}" for c in range(1, n + 1)]
            return " " + " ".join(words) + f" {BOXED_OPEN} " + " ".join(labelled) + " }"
        return " " + " ".join(words) + f" {BOXED_OPEN}{answer}}}"

    def verify(self, response_text: str, problem: Problem) -> bool:
        r"""Returns True iff the last ``\boxed{...}`` of the response holds exactly the answer.

        With the labelled read-out the box must hold the words ``r1_D .. rn_D`` in column order,
        preceded by ``r0_1`` exactly when the sum has a final carry: their digits must spell the
        answer, and every label must be the column it claims (a digit under a wrong label is wrong).
        """
        boxed = last_boxed(response_text)
        if boxed is None:
            return False
        if self.readout == "plain":
            return boxed.strip() == problem.answer
        return boxed.split() == self._labelled_answer(problem)

    @staticmethod
    def _labelled_answer(problem: Problem) -> list[str]:
        """Returns the words of the labelled read-out of ``problem``'s answer: ``["r0_1", ...]``."""
        n, answer = problem.meta["n_digits"], problem.answer
        carry, digits = (["r0_1"], answer[1:]) if len(answer) > n else ([], answer)
        return carry + [f"r{c}_{d}" for c, d in enumerate(digits, start=1)]
