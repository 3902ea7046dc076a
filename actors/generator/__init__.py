"""The generator actor kind: engines that turn prompts into completions with per-token logprobs and versions.

Importing this package does not import torch (the spec layer imports ``actors.generator._config``);
``TorchEngine`` is loaded on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors._lazy import lazy_exports

from ._types import (
    Completion,
    Engine,
    EngineClosedError,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    Tokenizer,
    WeightSource,
    WeightUpdateError,
)

if TYPE_CHECKING:
    from ._actor import GeneratorActor
    from ._http import EngineHTTPError
    from ._sglang import SGLangEngine
    from ._torch_engine import StepHook, TorchEngine
    from ._vllm import VLLMEngine
    from ._weights_group import Broadcaster, DistributedWeights, WeightBroadcaster

# name -> module that defines it; imported on first access (these modules import torch or httpx)
_LAZY = {
    "TorchEngine": "_torch_engine",
    "StepHook": "_torch_engine",
    "SGLangEngine": "_sglang",
    "VLLMEngine": "_vllm",
    "EngineHTTPError": "_http",
    "WeightBroadcaster": "_weights_group",
    "DistributedWeights": "_weights_group",
    "Broadcaster": "_weights_group",
    "GeneratorActor": "_actor",
}

__all__ = [
    "Broadcaster",
    "Completion",
    "DistributedWeights",
    "Engine",
    "EngineClosedError",
    "EngineHTTPError",
    "FinishReason",
    "GenerationRequest",
    "GeneratorActor",
    "SGLangEngine",
    "SamplingParams",
    "StepHook",
    "Tokenizer",
    "TorchEngine",
    "VLLMEngine",
    "WeightBroadcaster",
    "WeightSource",
    "WeightUpdateError",
]

__getattr__ = lazy_exports(__name__, _LAZY)
