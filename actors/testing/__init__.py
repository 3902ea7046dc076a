"""Public fakes for users' tests: inference servers that speak SGLang's and vLLM's HTTP shapes.

``async with FakeSGLangServer(engine) as server`` (or ``FakeVLLMServer``) serves a real
:class:`~actors.generator.TorchEngine` on a free loopback port in the caller's event loop, so the HTTP
engine clients — and the whole loop — run without GPUs. ``running_actor`` starts one replica of an actor kind
in the test's event loop, as a runtime would. Importing this package imports torch.
"""

from actors.testing._actors import actor_context, running_actor
from actors.testing._fake_sglang import FakeSGLangServer
from actors.testing._fake_vllm import FakeVLLMServer
from actors.testing._server import AppServer, free_port

__all__ = ["AppServer", "FakeSGLangServer", "FakeVLLMServer", "actor_context", "free_port", "running_actor"]
