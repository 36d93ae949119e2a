"""How a training process meets SIGTERM (``kill``, a container stop, Slurm's scancel or preemption)."""

import signal
import threading


def sigterm_interrupts() -> None:
    """Makes SIGTERM end the run as Ctrl-C does: the run is marked KILLED in MLflow and says so in its
    folder (a grid cell: ``failed``, with the signal as its error), instead of staying RUNNING.

    Under submitit, which ignores SIGTERM so that Slurm's SIGKILL ``KillWait`` seconds later is what
    ends a job, this handler replaces submitit's: a cancelled cell stops within one step, its last
    checkpoint intact, and the same grid command resumes it. Only the main thread can set a handler;
    elsewhere this does nothing.
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
