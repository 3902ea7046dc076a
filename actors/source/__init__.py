"""The `source` actor kind: draws tasks from the spec's domains by weight and publishes them to `prompts`.

Its config model lives in `actors.source._config`; the actor in `_actor`, imported lazily by the runtime. The task
sources themselves are the `actors.domains` library.
"""

__all__: list[str] = []
