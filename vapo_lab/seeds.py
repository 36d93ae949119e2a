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
    """A rank's rollout stream restarted at ``step`` (a checkpoint resumed on other rank counts)."""
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


# The critic's start is shared by every run of a grid (a cache), so its streams derive from the
# data split's seed (``task.seed``), not the run's.
REWARD_MODEL_DATA_OFFSET = 99
PRETRAIN_DATA_OFFSET = 5
PRETRAIN_STREAM_OFFSET = 1
PRETRAIN_UPDATE_SEED = 3


def reward_model_data_seed(task_seed: int) -> int:
    """The seed of the reward model's problem order."""
    return task_seed + REWARD_MODEL_DATA_OFFSET


def reward_model_rollout_seed(task_seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s stream for the reward model's samples and step order."""
    return rollout_seed(task_seed, rank)


def pretrain_data_seed(task_seed: int) -> int:
    """The seed of value pretraining's problem order."""
    return task_seed + PRETRAIN_DATA_OFFSET


def pretrain_rollout_seed(task_seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s stream for value pretraining's samples."""
    return rollout_seed(task_seed + PRETRAIN_STREAM_OFFSET, rank)


def pretrain_update_seed() -> int:
    """The seed of value pretraining's mini-batch shuffling (the same on every rank)."""
    return PRETRAIN_UPDATE_SEED


def random_critic_seed(seed: int) -> int:
    """The seed of a critic's random initial weights (``critic.init=random``)."""
    return seed
