"""flywheel's application: online continual RL of language models, on the `topology` framework.

Importing this package registers the application with the framework (the ``flywheel.plugins`` entry point names
it): each actor kind from its light ``actors/<kind>/_config.py`` (a config model and one `register_actor_kind`
call), the ``policy`` and ``domains`` spec sections with their checks, the application's commands and the live
view of ``flywheel up``. Nothing heavy is imported here: factories, commands and the view are named by strings and
imported when used, so ``flywheel validate`` stays fast.

Layers (checked by `just lint`): the kinds (source, generator, verify, learner, gateway, joiner, recorder, gate)
never import each other and meet on the bus and through `actors.protocol`; the libraries (policy, engines,
domains, sandbox, weights, replay, testing) and `actors.protocol` never import a kind; `actors.commands` uses the
libraries, never a kind.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from actors.gate import _config as _gate_config
from actors.gateway import _config as _gateway_config
from actors.generator import _config as _generator_config
from actors.joiner import _config as _joiner_config
from actors.learner import _config as _learner_config
from actors.policy._gpt_config import CONFIG_ON_RESUME
from actors.protocol import DomainSpec, PolicySpec
from actors.recorder import _config as _recorder_config
from actors.source import _config as _source_config
from actors.verify import _config as _verify_config
from topology import (
    Command,
    KeyPath,
    SectionCheck,
    SpecSection,
    register_command,
    register_live_view,
    register_spec_section,
)

__all__: list[str] = []


def _check_policy(check: SectionCheck, path: KeyPath, policy: PolicySpec) -> PolicySpec:
    from actors.policy import check_policy

    return check_policy(check, path, policy)


def _record_policy(path: KeyPath, policy: PolicySpec) -> dict[str, Any]:
    from actors.policy._fingerprint import record_policy

    return record_policy(path, policy)


def _resume_policy(path: KeyPath, recorded: Mapping[str, Any], policy: PolicySpec) -> Sequence[str]:
    from actors.policy._fingerprint import resume_policy

    return resume_policy(path, recorded, policy)


def _policy_as_resumed(policy: Mapping[str, Any]) -> Mapping[str, Any]:
    from actors.policy._fingerprint import policy_as_resumed

    return policy_as_resumed(policy)


def _record_domain(path: KeyPath, domain: DomainSpec) -> dict[str, Any]:
    from actors.domains._resume import record_domain

    return record_domain(path, domain)


def _resume_domain(path: KeyPath, recorded: Mapping[str, Any], domain: DomainSpec) -> Sequence[str]:
    from actors.domains._resume import resume_domain  # opens task sources: imported when a run resumes

    return resume_domain(path, recorded, domain)


def _check_domain(check: SectionCheck, path: KeyPath, domain: DomainSpec) -> DomainSpec:
    from actors.domains._checks import check_domain  # opens task sources: imported when a spec is checked

    return check_domain(check, path, domain)


register_spec_section(
    SpecSection(
        name="policy",
        model=PolicySpec,
        required=True,
        summary="the language model being trained and served",
        check=_check_policy,
        fixed_on_resume={
            "model": "the run's checkpoints hold the weights of the model it started with",
            "config": "the run's checkpoints hold the weights of the model it started with",
            **{f"config.{key}": why for key, why in CONFIG_ON_RESUME.items() if why is not None},
        },
        free_on_resume=tuple(f"config.{key}" for key, why in CONFIG_ON_RESUME.items() if why is None),
        # config.json and vocabulary hashes: a model or tokenizer replaced in place, or `tokenizer` naming another
        #   vocabulary, is refused (the key is judged by the vocabulary it names, not its text)
        record=_record_policy,
        on_resume=_resume_policy,
        resume_view=_policy_as_resumed,  # a preset and the sizes it stands for are one model: compared resolved
    )
)
register_spec_section(
    SpecSection(
        name="domains",
        model=DomainSpec,
        keyed=True,
        entry_noun="domain",
        summary="task domains: where prompts come from and how completions are scored",
        check=_check_domain,
        record=_record_domain,  # what decides the held-out split: a resume that moves training tasks into it warns
        on_resume=_resume_domain,
    )
)
for _command in (
    Command("replay", "actors.commands._replay:replay", "re-issue recorded prompts against a weight version"),
    Command("review", "actors.commands._review:review", "label production samples routed to human review"),
    Command("promote", "actors.commands._promote:promote", "move the serving version to a weight version"),
    Command("rollback", "actors.commands._promote:rollback", "move the serving version back"),
    Command("gate", "actors.commands._promote:gate", "pause the promotion gate, or let it decide again"),
    Command("sandbox", "actors.commands._sandbox:sandbox", "run a program in the sandbox, print a JSON verdict"),
    Command("verify", "actors.commands._verify:verify", "score one answer with any verifier, print a JSON verdict"),
):
    register_command(_command)
register_live_view("actors.commands._live:LearningView")

del _gateway_config, _generator_config, _joiner_config, _learner_config, _recorder_config, _source_config
del _verify_config, _gate_config, _command
