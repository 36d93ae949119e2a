"""Which rank died, from torchrun's failures (``launch.torchrun.dead_rank``): a signal other than
the SIGTERM torchrun's agent sends the survivors, from a rank that left no error line."""

from vapo_lab.launch.torchrun import dead_rank, describe


def _f(rank, exitcode, signal, time):
    return {"rank": rank, "exitcode": exitcode, "signal": signal, "time": time}


def test_the_rank_killed_by_sigkill_is_the_dead_one_not_the_survivor_the_agent_stopped():
    failures = [_f(0, -15, "SIGTERM", 10.0), _f(1, -9, "SIGKILL", 10.0)]
    assert dead_rank(failures, set())["rank"] == 1
    assert describe(failures) == "rank 1 killed by SIGKILL"


def test_ranks_that_said_why_or_were_stopped_are_no_dead_rank():
    # rank 1 raised (its error line written), rank 0 was stopped by the agent
    assert dead_rank([_f(0, -15, "SIGTERM", 1.0), _f(1, 1, None, 1.0)], {1}) is None
    # a rank that wrote its line and then was killed is reported by its line
    assert dead_rank([_f(1, -9, "SIGKILL", 1.0)], {1}) is None
    assert describe([_f(0, 1, None, 1.0)]) == "rank 0 exited with status 1"


def test_of_two_killed_ranks_the_first_seen_is_named():
    failures = [_f(2, -11, "SIGSEGV", 5.0), _f(1, -9, "SIGKILL", 4.0)]
    assert dead_rank(failures, set())["rank"] == 1
