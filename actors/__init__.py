"""Builtin actor kinds. Importing this package registers every builtin kind (config models only).

Each ``actors/<kind>/_config.py`` is a light module — a pydantic config model and one
``register_actor_kind`` call, no torch — so ``flywheel validate`` and ``plan`` stay fast. The actor classes
are imported lazily by the runtime through each kind's factory string.
"""

from actors.gate import _config as _gate_config
from actors.gateway import _config as _gateway_config
from actors.generator import _config as _generator_config
from actors.joiner import _config as _joiner_config
from actors.learner import _config as _learner_config
from actors.recorder import _config as _recorder_config
from actors.source import _config as _source_config
from actors.verify import _config as _verify_config

__all__: list[str] = []

del _gateway_config, _generator_config, _joiner_config, _learner_config, _recorder_config, _source_config
del _verify_config, _gate_config
