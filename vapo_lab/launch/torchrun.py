"""torchrun as vapo-lab starts it: ``torch.distributed.run`` whose failure is data, not a traceback.

torchrun reports a failed rank with its agent's log lines and a ~40-line ``ChildFailedError``
traceback, whose "root cause" is whichever failure its monitor saw first: a rank killed by SIGKILL
and the rank that then lost its connection to it tie. Run as ``python -m vapo_lab.launch.torchrun
<torchrun arguments>``, this is torchrun (its own ``parse_args`` and ``run``) with the agent's
logging quietened, and a failure written as JSON, one entry a rank (exit code, signal), to
``$VAPO_LAUNCH_DIR/failures.json`` for the launcher (``vapo_lab.launch.ranks``) to name the rank
that died in one line. Exit status 1 on a failure.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

FAILURES_FILE = "failures.json"
LAUNCH_DIR = "VAPO_LAUNCH_DIR"  # the launcher's folder for the ranks' result and error files


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # its "Sending process N closing signal SIGTERM" and "failed (exitcode: -9)": said once, by us
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as e:
        failures = [
            {
                "rank": int(rank),
                "exitcode": int(f.exitcode),
                "signal": f.signal_name() if f.exitcode < 0 else None,
                "time": float(f.timestamp),
            }
            for rank, f in sorted(e.failures.items())
        ]
        folder = os.environ.get(LAUNCH_DIR)
        if folder:
            (Path(folder) / FAILURES_FILE).write_text(json.dumps(failures))
        else:  # run by hand: the one line here
            print(f"torchrun: {describe(failures)}", file=sys.stderr)
        return 1
    return 0


def read_failures(folder: Path) -> list[dict[str, Any]]:
    """Returns the failures ``main`` wrote to ``folder`` ([] when none, or unreadable)."""
    try:
        return list(json.loads((folder / FAILURES_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return []


def dead_rank(failures: list[dict[str, Any]], reported: set[int]) -> dict[str, Any] | None:
    """Returns the failure of the rank that died of a signal (the first seen), None when none did.

    ``reported``: the ranks that wrote an error line (they failed with a message, not a signal).
    SIGTERM is no death here: it is what torchrun's agent sends the other ranks once one has
    ended, and a rank's own SIGTERM is a stop it handles (``vapo_lab.stop``), saying so itself."""
    died = [
        f
        for f in failures
        if f.get("signal") and f["signal"] != "SIGTERM" and f["rank"] not in reported
    ]
    return min(died, key=lambda f: (f["time"], f["rank"])) if died else None


def describe(failures: list[dict[str, Any]]) -> str:
    """Returns one line naming the failed ranks, e.g. "rank 1 killed by SIGKILL"."""
    dead = dead_rank(failures, set())
    if dead is not None:
        return f"rank {dead['rank']} killed by {dead['signal']}"
    return ", ".join(f"rank {f['rank']} exited with status {f['exitcode']}" for f in failures)


if __name__ == "__main__":
    sys.exit(main())
