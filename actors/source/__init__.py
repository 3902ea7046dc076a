"""Domain task sources (builtin generators, JSONL files) and the `source` actor that feeds `prompts`.

The domain library is pure Python (no bus, no torch): the learner's warm start and held-out evaluator use it
directly. The actor lives in `actors.source._actor` and is imported lazily by the runtime.
"""

from ._builtin import BuiltinSource
from ._builtin_arithmetic import ArithmeticOptions
from ._builtin_extract import ExtractOptions
from ._builtin_pyexpr import PyExprOptions
from ._domains import BUILTIN_SOURCES, Domain, DomainSampler, DomainSource, domains_from_spec, open_source
from ._jsonl import JsonlSource, read_jsonl_tasks
from ._task import SourceError, Task, heldout_bucket, task_id

__all__ = [
    "BUILTIN_SOURCES",
    "ArithmeticOptions",
    "BuiltinSource",
    "Domain",
    "DomainSampler",
    "DomainSource",
    "ExtractOptions",
    "JsonlSource",
    "PyExprOptions",
    "SourceError",
    "Task",
    "domains_from_spec",
    "heldout_bucket",
    "open_source",
    "read_jsonl_tasks",
    "task_id",
]
