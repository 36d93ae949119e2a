"""What the rank scripts share: how a rank ends, and counting what it reads of a checkpoint."""

import os
import sys

import torch
import torch.distributed.checkpoint as dcp

# the elements this rank has read through HuggingFaceStorageReader since ``count_reads``: its
# slices only, not whole tensors
READ = [0]


def count_reads() -> None:
    """Makes every HuggingFaceStorageReader read of this process add its elements to ``READ``."""
    process = dcp.HuggingFaceStorageReader._process_read_request
    if getattr(process, "counting", False):
        return

    def counting(self, f, req, planner):
        READ[0] += int(torch.Size(req.lengths).numel())
        return process(self, f, req, planner)

    counting.counting = True
    dcp.HuggingFaceStorageReader._process_read_request = counting


def leave() -> None:
    """Ends a rank: every rank done before any leaves (a barrier), then out at once without tearing
    the gloo group down. Its threads' teardown aborted now and then under load ("terminate called
    without an active exception", SIGABRT) after every result was written."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
