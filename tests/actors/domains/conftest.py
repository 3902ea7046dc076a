"""The verifier tests run code through a real sandbox pool: the same fixture as the sandbox tests."""

from tests.actors.sandbox.conftest import sandbox

__all__ = ["sandbox"]
