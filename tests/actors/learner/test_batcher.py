"""DomainBatcher: ratios follow the domains' weights, whole groups only, never stalls on a missing domain."""

from __future__ import annotations

from actors.learner import DomainBatcher


def test_batches_follow_domain_weights() -> None:
    batcher: DomainBatcher[str] = DomainBatcher({"a": 3.0, "b": 1.0}, batch_size=16)
    for i in range(200):
        batcher.add("a", f"a{i}", 4)
        batcher.add("b", f"b{i}", 4)
    taken = [item for _ in range(20) for item in batcher.take()]
    share_a = sum(item.startswith("a") for item in taken) / len(taken)
    assert abs(share_a - 0.75) < 0.03
    assert len(taken) == 20 * 4  # 16 completions = 4 groups of 4 per batch, never split


def test_missing_domain_fills_from_others_after_wait() -> None:
    now = [0.0]
    batcher: DomainBatcher[str] = DomainBatcher(
        {"a": 1.0, "b": 1.0}, batch_size=8, fill_wait_s=2.0, clock=lambda: now[0]
    )
    for i in range(4):
        batcher.add("a", f"a{i}", 2)
    assert not batcher.ready()  # enough in total, but b has none of its share yet
    now[0] = 2.5
    assert batcher.ready()
    assert batcher.take() == ["a0", "a1", "a2", "a3"]


def test_unknown_domain_gets_weight_one_and_is_ready_when_balanced() -> None:
    batcher: DomainBatcher[int] = DomainBatcher({"a": 1.0}, batch_size=4, fill_wait_s=60)
    batcher.add("a", 1, 2)
    batcher.add("prod", 2, 2)
    assert batcher.shares() == {"a": 0.5, "prod": 0.5}
    assert batcher.ready()
    assert sorted(batcher.take()) == [1, 2]
    assert batcher.completions == 0


def test_two_batches_buffered_never_wait_for_a_short_domain() -> None:
    """A learner that is the bottleneck must not idle for a domain's share: the credit carries it over."""
    now = [0.0]
    batcher: DomainBatcher[str] = DomainBatcher(
        {"a": 1.0, "b": 1.0}, batch_size=8, fill_wait_s=60, clock=lambda: now[0]
    )
    for i in range(7):
        batcher.add("a", f"a{i}", 2)
    assert not batcher.ready()  # 14 completions: less than two batches, b still has time to arrive
    batcher.add("a", "a7", 2)
    assert batcher.ready()  # 16: take now, at time 0
    assert batcher.take() == ["a0", "a1", "a2", "a3"]
    for i in range(4):
        batcher.add("b", f"b{i}", 2)
    assert batcher.take() == ["b0", "b1", "b2", "b3"]  # b's unused credit first


def test_a_short_batch_is_ready_once_its_oldest_sample_waited_partial_after_s() -> None:
    now = [0.0]
    batcher: DomainBatcher[str] = DomainBatcher({"prod": 1.0}, batch_size=64, partial_after_s=30, clock=lambda: now[0])
    assert not batcher.ready()  # nothing buffered: nothing to wait for
    batcher.add("prod", "r1", 1)
    now[0] = 20.0
    batcher.add("prod", "r2", 1)
    assert not batcher.ready()
    now[0] = 30.0  # r1 has waited 30 s
    assert batcher.ready()
    assert batcher.take() == ["r1", "r2"]
    never: DomainBatcher[str] = DomainBatcher({"prod": 1.0}, batch_size=64, clock=lambda: now[0])
    never.add("prod", "r3", 1)
    now[0] = 1e6
    assert not never.ready()  # off by default
