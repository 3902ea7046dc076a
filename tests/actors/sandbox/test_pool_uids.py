"""Every pool runs its jobs under uids of its own, so one pool's fork bomb cannot starve another's jobs."""

from __future__ import annotations

from actors.sandbox import SandboxPool


def test_pools_get_disjoint_private_uid_ranges() -> None:
    first, second = SandboxPool(workers=2), SandboxPool(workers=2)
    ranges = [range(pool._uid_base, pool._uid_base + 64) for pool in (first, second)]
    assert not set(ranges[0]) & set(ranges[1])
    assert min(r.start for r in ranges) >= 1_000_000  # far above system and login uids
