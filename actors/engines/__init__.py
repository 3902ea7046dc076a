"""Generation engines: prompts in, completions with per-token behaviour logprobs and weight versions out.

A library: the `generator` kind drives an engine, replay and the gate generate with `TorchEngine`, the fakes in
`actors.testing` serve one over HTTP. `TorchEngine` is the builtin (continuous batching, in-flight weight swaps);
`SGLangEngine` and `VLLMEngine` are HTTP clients of running servers, which take new weights as a safetensors
directory or over a torch.distributed group (`WeightBroadcaster`, `DistributedWeights`). Importing this package does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.engines._types import Completion as Completion
from actors.engines._types import Engine as Engine
from actors.engines._types import EngineClosedError as EngineClosedError
from actors.engines._types import FinishReason as FinishReason
from actors.engines._types import GenerationRequest as GenerationRequest
from actors.engines._types import RequestError as RequestError
from actors.engines._types import SamplingParams as SamplingParams
from actors.engines._types import Tokenizer as Tokenizer
from actors.engines._types import UnsupportedServerError as UnsupportedServerError
from actors.engines._types import WeightSource as WeightSource
from actors.engines._types import WeightUpdateError as WeightUpdateError
from topology import lazy_exports

if TYPE_CHECKING:
    from actors.engines._group import Broadcaster as Broadcaster
    from actors.engines._group import DistributedWeights as DistributedWeights
    from actors.engines._group import WeightBroadcaster as WeightBroadcaster
    from actors.engines._group import WeightGroup as WeightGroup
    from actors.engines._group import parse_dtype as parse_dtype
    from actors.engines._group import receive_weights as receive_weights
    from actors.engines._http import EngineHTTPError as EngineHTTPError
    from actors.engines._sglang import SGLangEngine as SGLangEngine
    from actors.engines._torch import StepHook as StepHook
    from actors.engines._torch import TorchEngine as TorchEngine
    from actors.engines._vllm import VLLMEngine as VLLMEngine

_EXPORTS = {
    "Broadcaster": "_group",
    "DistributedWeights": "_group",
    "EngineHTTPError": "_http",
    "parse_dtype": "_group",
    "receive_weights": "_group",
    "SGLangEngine": "_sglang",
    "StepHook": "_torch",
    "TorchEngine": "_torch",
    "VLLMEngine": "_vllm",
    "WeightBroadcaster": "_group",
    "WeightGroup": "_group",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "Broadcaster",
    "Completion",
    "DistributedWeights",
    "Engine",
    "EngineClosedError",
    "EngineHTTPError",
    "FinishReason",
    "GenerationRequest",
    "RequestError",
    "SGLangEngine",
    "SamplingParams",
    "StepHook",
    "Tokenizer",
    "TorchEngine",
    "UnsupportedServerError",
    "VLLMEngine",
    "WeightBroadcaster",
    "WeightGroup",
    "WeightSource",
    "WeightUpdateError",
    "parse_dtype",
    "receive_weights",
]
