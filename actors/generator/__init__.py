"""The `generator` actor kind: `prompts` in, `rollouts` out, new weights swapped in while it runs.

Its config model lives in `actors.generator._config`; the actor in `_actor`, imported lazily by the runtime. The
engines it drives are the `actors.engines` library.
"""

__all__: list[str] = []
