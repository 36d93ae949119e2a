"""Every seed derived from a run's ``seed``, in one place.

Two primes space the streams: ``STEP_STRIDE`` separates the seeds of successive steps' held-out
evaluations, ``STREAM_STRIDE`` (larger than any step count) the independent streams of one seed
(each rank's rollouts, each epoch's data order, each evaluation chunk), so that no two meet.
"""

STEP_STRIDE = 7919
STREAM_STRIDE = 1_000_003
UPDATE_OFFSET = 7  # the update's shuffling stream: apart from the rollout stream of rank 0


def heldout_seed(seed: int, step: int) -> int:
    """The sampling seed of the held-out evaluation after ``step`` steps."""
    return seed * STEP_STRIDE + step


def rollout_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s rollout stream (rank 0: as a one-process run)."""
    return seed + STREAM_STRIDE * rank


def rollout_reseed(seed: int, rank: int, step: int) -> int:
    """A rank's rollout stream started afresh at ``step`` (a checkpoint resumed on another rank count)."""
    return rollout_seed(seed, rank) + STEP_STRIDE * step


def update_seed(seed: int) -> int:
    """The seed of the update's mini-batch shuffling (the same on every rank)."""
    return seed + UPDATE_OFFSET


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of the training problems' order in ``epoch``."""
    return seed * STREAM_STRIDE + epoch


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of evaluation chunk ``chunk`` (chunks are resumable units of an evaluation)."""
    return seed + STREAM_STRIDE * chunk
