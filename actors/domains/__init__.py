"""Task domains: where prompts come from (builtin generators, JSONL files) and how answers are scored.

A library (no bus, no actor kind): the `source` kind draws tasks from it, the `verify` kind and replay score with its
verifiers, the learner's warm start and held-out rounds read its tasks. Task sources are pure Python; the verifiers
that run code use the `actors.sandbox` pool, and symbolic math checks and users' ``module:function`` verifiers run
in killable, memory-limited helper processes (`actors.domains._verifiers._helpers`), never on the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.domains._arithmetic import ArithmeticOptions as ArithmeticOptions
    from actors.domains._builtin import BuiltinSource as BuiltinSource
    from actors.domains._domains import BUILTIN_SOURCES as BUILTIN_SOURCES
    from actors.domains._domains import Domain as Domain
    from actors.domains._domains import DomainSampler as DomainSampler
    from actors.domains._domains import DomainSource as DomainSource
    from actors.domains._domains import domains_from_spec as domains_from_spec
    from actors.domains._domains import find_task as find_task
    from actors.domains._domains import open_source as open_source
    from actors.domains._extract import ExtractOptions as ExtractOptions
    from actors.domains._jsonl import JsonlSource as JsonlSource
    from actors.domains._jsonl import read_jsonl_tasks as read_jsonl_tasks
    from actors.domains._pyexpr import PyExprOptions as PyExprOptions
    from actors.domains._score import DomainVerifier as DomainVerifier
    from actors.domains._score import Scorer as Scorer
    from actors.domains._score import score as score
    from actors.domains._task import SourceError as SourceError
    from actors.domains._task import Task as Task
    from actors.domains._task import heldout_bucket as heldout_bucket
    from actors.domains._task import task_id as task_id
    from actors.domains._verifiers import Verifier as Verifier
    from actors.domains._verifiers import VerifierError as VerifierError
    from actors.domains._verifiers import VerifyResult as VerifyResult
    from actors.domains._verifiers import build_verifier as build_verifier
    from actors.domains._verifiers import verifier_names as verifier_names

_EXPORTS = {
    "ArithmeticOptions": "_arithmetic",
    "build_verifier": "_verifiers",
    "BUILTIN_SOURCES": "_domains",
    "BuiltinSource": "_builtin",
    "Domain": "_domains",
    "domains_from_spec": "_domains",
    "DomainSampler": "_domains",
    "DomainSource": "_domains",
    "DomainVerifier": "_score",
    "ExtractOptions": "_extract",
    "find_task": "_domains",
    "heldout_bucket": "_task",
    "JsonlSource": "_jsonl",
    "open_source": "_domains",
    "PyExprOptions": "_pyexpr",
    "read_jsonl_tasks": "_jsonl",
    "score": "_score",
    "Scorer": "_score",
    "SourceError": "_task",
    "Task": "_task",
    "task_id": "_task",
    "Verifier": "_verifiers",
    "verifier_names": "_verifiers",
    "VerifierError": "_verifiers",
    "VerifyResult": "_verifiers",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "BUILTIN_SOURCES",
    "ArithmeticOptions",
    "BuiltinSource",
    "Domain",
    "DomainSampler",
    "DomainSource",
    "DomainVerifier",
    "ExtractOptions",
    "JsonlSource",
    "PyExprOptions",
    "Scorer",
    "SourceError",
    "Task",
    "Verifier",
    "VerifierError",
    "VerifyResult",
    "build_verifier",
    "domains_from_spec",
    "find_task",
    "heldout_bucket",
    "open_source",
    "read_jsonl_tasks",
    "score",
    "task_id",
    "verifier_names",
]
