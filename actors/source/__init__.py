"""Domain task sources (builtin generators, JSONL files) and the `source` actor that feeds `prompts`.

The domain library is pure Python (no bus, no torch): the learner's warm start and held-out evaluator use it
directly. The actor lives in `actors.source._actor` and is imported lazily by the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors._lazy import lazy_exports

if TYPE_CHECKING:
    from ._builtin import BuiltinSource as BuiltinSource
    from ._builtin_arithmetic import ArithmeticOptions as ArithmeticOptions
    from ._builtin_extract import ExtractOptions as ExtractOptions
    from ._builtin_pyexpr import PyExprOptions as PyExprOptions
    from ._domains import BUILTIN_SOURCES as BUILTIN_SOURCES
    from ._domains import Domain as Domain
    from ._domains import DomainSampler as DomainSampler
    from ._domains import DomainSource as DomainSource
    from ._domains import domains_from_spec as domains_from_spec
    from ._domains import open_source as open_source
    from ._jsonl import JsonlSource as JsonlSource
    from ._jsonl import read_jsonl_tasks as read_jsonl_tasks
    from ._task import SourceError as SourceError
    from ._task import Task as Task
    from ._task import heldout_bucket as heldout_bucket
    from ._task import task_id as task_id

_EXPORTS = {
    "ArithmeticOptions": "_builtin_arithmetic",
    "BUILTIN_SOURCES": "_domains",
    "BuiltinSource": "_builtin",
    "Domain": "_domains",
    "DomainSampler": "_domains",
    "DomainSource": "_domains",
    "ExtractOptions": "_builtin_extract",
    "JsonlSource": "_jsonl",
    "PyExprOptions": "_builtin_pyexpr",
    "SourceError": "_task",
    "Task": "_task",
    "domains_from_spec": "_domains",
    "heldout_bucket": "_task",
    "open_source": "_domains",
    "read_jsonl_tasks": "_jsonl",
    "task_id": "_task",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
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
