"""The verify kind's config (`actors.verify._config`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from actors.verify._config import SandboxConfig


def test_an_isolation_below_min_isolation_is_refused_and_an_opt_in_is_not() -> None:
    with pytest.raises(ValidationError, match="expected isolation bwrap or stronger"):
        SandboxConfig(isolation="unshare")
    assert SandboxConfig(isolation="unshare", min_isolation="unshare").isolation == "unshare"
    assert SandboxConfig(isolation="bwrap", min_isolation="rlimits").isolation == "bwrap"
