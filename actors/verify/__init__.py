"""The `verify` actor kind: `rollouts` in, each completion scored by its domain's verifier, `scored` out.

Its config model lives in `actors.verify._config`; the actor in `_actor`, imported lazily by the runtime. Verifiers
are in `actors.domains`, the sandbox pool that runs code in `actors.sandbox`.
"""

__all__: list[str] = []
