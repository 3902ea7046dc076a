"""The public fakes module exports exactly what users' tests are meant to import."""

import actors.testing


def test_public_names() -> None:
    assert set(actors.testing.__all__) == {"AppServer", "FakeSGLangServer", "FakeVLLMServer", "free_port"}
    for name in actors.testing.__all__:
        assert getattr(actors.testing, name) is not None
