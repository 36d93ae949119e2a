"""How a rank script ends: every rank done before any leaves, then out without tearing the gloo
group down. Its threads' teardown aborted now and then under load ("terminate called without an
active exception", SIGABRT) after every result was written."""

import os
import sys

import torch


def leave() -> None:
    """Waits for every rank (a barrier), flushes this rank's output and exits 0 at once."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
