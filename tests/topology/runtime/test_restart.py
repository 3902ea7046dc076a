from topology.runtime import RestartPolicy


def policy() -> RestartPolicy:
    return RestartPolicy(max_restarts=3, window_s=10.0, backoff_s=0.5, backoff_max_s=1.5)


def test_backoff_doubles_and_is_capped() -> None:
    p = policy()
    assert [p.on_crash("a", now=t) for t in (0.0, 1.0, 2.0)] == [0.5, 1.0, 1.5]


def test_gives_up_after_max_restarts_within_the_window() -> None:
    p = policy()
    for t in (0.0, 1.0, 2.0):
        assert p.on_crash("a", now=t) is not None
    assert p.on_crash("a", now=3.0) is None


def test_crashes_outside_the_window_are_forgotten() -> None:
    p = policy()
    for t in (0.0, 1.0, 2.0):
        p.on_crash("a", now=t)
    assert p.on_crash("a", now=30.0) == 0.5
    assert p.crashes_in_window("a", now=30.0) == 1


def test_replicas_have_separate_budgets() -> None:
    p = policy()
    for t in (0.0, 1.0, 2.0):
        p.on_crash(("a", 0), now=t)
    assert p.on_crash(("a", 1), now=3.0) == 0.5
