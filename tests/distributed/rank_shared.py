"""One rank of a 2-rank gloo world checking that it sees the folders rank 0 writes; with
``--apart`` rank 1 works from a folder of its own, as a node without the shared file system would.
Writes each rank's error line (or "ok") to OUT/rank<r>.txt.

Usage (torchrun): rank_shared.py OUT [--apart]
"""

import os
import sys
from pathlib import Path

import torch

from tests.distributed.ranks import leave
from vapo_lab.distributed.world import World


def main() -> None:
    out, apart = Path(sys.argv[1]).resolve(), "--apart" in sys.argv
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    here = out / ("apart" if apart and rank == 1 else "shared")
    here.mkdir(parents=True, exist_ok=True)
    os.chdir(here)  # relative folders, as a run's are
    world = World(rank, 2, rank, initialized=True)
    try:
        world.require_shared({"the run folder": Path("runs/x"), "the shared caches": Path(".c")})
        line = "ok"
    except Exception as e:  # noqa: BLE001 - what the rank says is the result
        line = f"{type(e).__name__}: {e}"
    (out / f"rank{rank}.txt").write_text(line)
    leave()


if __name__ == "__main__":
    main()
