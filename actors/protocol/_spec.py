"""The application's sections of a topology spec: ``policy`` (the model) and ``domains`` (the task domains).

Contract: these models are registered with the framework as spec sections (`actors._app`), so a spec's
``policy:`` and ``domains:`` are validated like the framework's own sections — strict, ``extra="forbid"``, every
error at its ``file:line`` — and then checked by the hooks in `actors.domains._checks` and `actors.policy._checks`
(files exist, task sources open, builtin names are known). Every actor reads them through `policy_of` and
`domains_of`; a spec without ``domains:`` has none.

Non-goals: validating ``policy.config`` here (the policy library owns the model's hyper-parameters: its check names
an unknown key, and the model says what is wrong with a value when it is built).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator

from topology import Spec, SpecModel, show

__all__ = [
    "BUILTIN_MODELS",
    "DomainSpec",
    "PolicySpec",
    "WarmStartSpec",
    "count_removed_domain",
    "domains_of",
    "failed_groups_of",
    "policy_of",
]

BUILTIN_MODELS = ("tiny-gpt",)
_CALLABLE_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_BUILTIN_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def _positive_or_auto(value: float | str) -> float | str:
    if value != "auto" and not value > 0:  # type: ignore[operator]
        raise ValueError(f'expected a number > 0 or "auto", got {value!r}')
    return value


# a learning rate in a spec: a number > 0, or "auto" (resolved by the learner from the policy's size)
LearningRate = Annotated[float | Literal["auto"], AfterValidator(_positive_or_auto)]


class WarmStartSpec(SpecModel):
    """Supervised warm start run by the learner when no checkpoint exists."""

    # null: 200 for a builtin model (random weights: RL needs some reward to climb from), 0 for an hf: model (a
    # trained model's weights are the starting point; an SFT phase it did not ask for would change them); 0 disables
    steps: int | None = Field(default=None, ge=0)
    # supervised learning rate; auto: 5 × the learner's `lr: auto` for the policy's size (1e-3 up to 1M parameters,
    #   5e-6 from 500M: a pretrained model's fine-tuning rate, not a from-scratch one)
    lr: LearningRate = "auto"
    batch_size: int = Field(default=32, ge=1)  # (prompt, reference) pairs per supervised step


class PolicySpec(SpecModel):
    """The language model being trained and served."""

    model: str  # builtin:<name> (builtin:tiny-gpt) or hf:<model dir or hub id> (a hub id: from the machine's Hugging
    #   Face cache, never downloaded at run time)
    tokenizer: str | None = None  # another tokenizer for an hf: model (a directory relative to the spec file, or a
    #   cached hub id); null: the model's own. Its vocabulary must fit the model's embeddings
    config: dict[str, Any] = Field(default_factory=dict)  # the model's settings. builtin: preset (tiny, small,
    #   medium), n_layer, n_head, n_embd, block_size, vocab_size, rope_theta, seed, dtype; hf: dtype (float32,
    #   bfloat16, float16), native_forward (true: flywheel's own forward
    #   for GPT-2 models at inference; false: transformers')
    checkpoint: str | None = None  # start from these weights (path, relative to the spec file); null: fresh
    warm_start: WarmStartSpec = WarmStartSpec()  # supervised steps on the reference answers before RL

    @property
    def warm_start_steps(self) -> int:
        """``warm_start.steps``, its default resolved by the kind of model (see `WarmStartSpec`)."""
        if self.warm_start.steps is not None:
            return self.warm_start.steps
        return 200 if self.model.startswith("builtin:") else 0

    @field_validator("model")
    @classmethod
    def _check_model(cls, model: str) -> str:
        scheme, sep, rest = model.partition(":")
        if scheme == "builtin" and sep:
            if rest not in BUILTIN_MODELS:
                raise ValueError(f"expected a builtin model ({', '.join(BUILTIN_MODELS)}), got {show(model)}")
            return model
        if scheme == "hf" and sep and rest:
            return model
        raise ValueError(f"expected builtin:<name> or hf:<path or hub id>, got {show(model)}")


class DomainSpec(SpecModel):
    """A task domain: where prompts come from and how completions are scored."""

    source: str  # builtin:<arithmetic|pyexpr|extract>[?option=value&…] or jsonl:<path relative to the spec>, one
    #   task a line: {"prompt", "answer"} for math, else {"prompt", "verifier_fields": {…}} with what the verifier
    #   reads (python-tests: {"tests": "assert f(2) == 4"}; python-expr: target; json-fields: fields; yours: any),
    #   optional "id" and "reference" (a correct completion, for the warm start)
    # options of a builtin source (also accepted in its string: builtin:arithmetic?digits=3). arithmetic: digits
    #   (per operand, 1-4, default 2), ops (operators per expression, 1-3, default 1), operators (a subset of +-*,
    #   default +-); pyexpr: terms (digits to combine, 2-5, default 3), operators (default +-*); extract: fields (in
    #   the record, 2-3, default 3), ask (fields asked for at most, 1-fields, default 2)
    source_options: dict[str, Any] = Field(default_factory=dict)
    verifier: str  # math | python-tests | python-expr | json-fields | <module>:<function>
    #   (yours: fn(completion_text, task) → a reward, or {"reward", "verdict": a name of ≤ 40 characters, "detail"};
    #   its module importable: on PYTHONPATH; what it prints goes to the verify replica's log)
    verifier_config: dict[str, Any] = Field(default_factory=dict)  # the verifier's keyword arguments. math:
    #   answer_field; python-tests: tests_field, timeout_s; python-expr: timeout_s, rel_tol, abs_tol, max_chars,
    #   memo_size, memo_max_bytes; json-fields: mode, modes, rel_tol, abs_tol, penalize_extra, max_chars;
    #   <module>:<function>: any (handed to it as config=, {} when empty to a function that declares config)
    # a <module>:<function> verifier: how long one call may take before the process running it is killed (verdict
    # timeout, reward 0: a hostile answer can make a verifier hang); null: 30 s. Builtins that run code take theirs
    # from verifier_config (python-tests, python-expr: timeout_s)
    verifier_timeout_s: float | None = Field(default=None, gt=0)
    # a <module>:<function> verifier: helper processes that run its calls, so calls at once, per verify replica (its
    # own: another domain's slow verifier never waits for these); raise it for a verifier that waits on a service
    verifier_processes: int = Field(default=2, ge=1, le=64)
    weight: float = Field(default=1.0, gt=0)  # sampling weight: the share of prompts drawn (normalized over all
    #   domains); the learner's batches hold each domain's completions in the same proportion, weight × group_size
    #   — so a slow domain (code whose tests take seconds) paces every domain: all of them move at the slow one's
    #   scoring rate divided by its share; give it sandbox workers or a smaller weight
    group_size: int = Field(default=8, ge=1)  # completions per prompt (GRPO group); 1 = single samples
    heldout: int | str = 200  # held-out prompts for evaluation: a count (>= 0) or jsonl:<path>
    max_new_tokens: int = Field(default=64, ge=1)  # generation budget for this domain's prompts
    # a group with no correct completion: skip it when all scored 0, or train on the task's reference answer
    # added to it when its verifier scores that reference correct (partial credit counts as not correct); null: the
    # learner's `failed_groups` (skip by default)
    failed_groups: Literal["skip", "reference"] | None = None

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str) -> str:
        scheme, sep, rest = source.partition(":")
        if scheme in ("builtin", "jsonl") and sep and rest:
            return source  # which builtins exist, and whether the file opens: the domains library's check
        raise ValueError(f"expected builtin:<name> or jsonl:<path>, got {show(source)}")

    @field_validator("verifier")
    @classmethod
    def _check_verifier(cls, verifier: str) -> str:
        if _BUILTIN_NAME.match(verifier) or _CALLABLE_REF.match(verifier):
            return verifier  # which builtins exist: the domains library's check
        raise ValueError(f"expected a builtin verifier name or module:function, got {show(verifier)}")

    @field_validator("heldout", mode="before")
    @classmethod
    def _check_heldout(cls, heldout: Any) -> Any:
        if isinstance(heldout, int) and not isinstance(heldout, bool) and heldout >= 0:
            return heldout
        if isinstance(heldout, str) and heldout.startswith("jsonl:") and len(heldout) > len("jsonl:"):
            return heldout
        raise ValueError(f"expected a count >= 0 or jsonl:<path>, got {show(heldout)}")


def policy_of(spec: Spec) -> PolicySpec:
    """The spec's ``policy`` section (required by the application, so always present in a validated spec)."""
    policy = spec.sections.get("policy")
    if not isinstance(policy, PolicySpec):
        raise ValueError(f"spec {spec.name!r} has no policy section")
    return policy


def domains_of(spec: Spec) -> Mapping[str, DomainSpec]:
    """The spec's task domains by name (empty when it has no ``domains:``)."""
    domains: Mapping[str, DomainSpec] = spec.sections.get("domains", {})
    return domains


def count_removed_domain(ctx: Any, domain: str, what: str) -> None:
    """Count a message of ``domain``, which the spec no longer has (a run resumed with an edited spec), in
    ``removed_domain.<domain>`` of ``ctx`` (an actor's context), and log it at the first: ``what`` names the
    messages dropped ("prompts", "rollouts"). The caller settles the message; nothing downstream would use it."""
    ctx.counters.inc(f"removed_domain.{domain}")
    if ctx.counters.get(f"removed_domain.{domain}") == 1:
        ctx.log.info(
            f"{ctx.kind}.removed_domain",
            domain=domain,
            note=f"no longer in the spec: its {what} still on the bus are dropped, counted in removed_domain",
        )


def failed_groups_of(spec: Spec, domain: str) -> Literal["skip", "reference"]:
    """What the spec's learners do with a group of ``domain`` that has no correct completion: the domain's own
    ``failed_groups``, else ``reference`` when a learner's config says so, else ``skip``. The verify actor scores a
    failed group's reference only where this is ``reference`` (the learner trains on no reference unscored)."""
    own = domains_of(spec).get(domain)
    if own is not None and own.failed_groups is not None:
        return own.failed_groups
    learners = (a.config for a in spec.actors.values() if a.kind == "learner")
    return "reference" if any(getattr(c, "failed_groups", None) == "reference" for c in learners) else "skip"
