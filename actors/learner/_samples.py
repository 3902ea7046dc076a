"""From one scored group to the rows an RL step trains on.

Contract (:meth:`SampleMaker.make`):
- Every group passed in is counted in its domain's running reward and accuracy (the last ``REWARD_WINDOW`` groups:
  the ``reward.<domain>`` and ``accuracy.<domain>`` counters and ``step`` rows the learner reports).
- ``failed_groups: reference`` (the domain's setting, else the learner's): a group of several completions none of
  which is correct is joined by its task's reference answer with reward 1 (``guided.<domain>``), when the domain's
  verifier scored that reference correct; else it goes on without it (``reference_unverified.<domain>``).
- Advantages come from ``_advantages``: relative to the group for several completions, a running per-domain
  baseline for a single one. A group without signal (every reward equal, no guidance) gives None (``groups_skipped``
  counts them); :meth:`SampleMaker.count_no_signal` says why (``no_signal_solved``, ``no_signal_failed``,
  ``no_signal_other`` per domain). ``NO_SIGNAL_STREAK`` groups of a domain in a row without signal are logged
  (``learner.no_signal_streak``, again at every further multiple of it): nothing of that domain is being learned.
- A row with no tokens, or that with its prompt does not fit the policy's context, is left out
  (``too_long_skipped``): the group's other rows still train.
- Every domain group's outcome (signal or not) is noted in ``outcomes`` (``_outcomes``) for the sources that drew it.

Non-goals: which groups reach it (staleness, verifier errors, duplicates: the intake), the loss (``_loss``).
"""

from __future__ import annotations

from collections import deque

from actors.learner._advantages import AdvantageEstimator
from actors.learner._config import LearnerConfig
from actors.learner._outcomes import OutcomeReporter
from actors.learner._trainer import TrainSample
from actors.policy import Policy, encode_completion
from actors.protocol import CORRECT, ScoredMsg, domains_of
from topology.runtime import ActorContext

__all__ = ["REWARD_WINDOW", "SampleMaker"]

REWARD_WINDOW = 100  # groups in the running reward / accuracy per domain
NO_SIGNAL_STREAK = 500  # a domain's groups in a row without signal that are worth a warning
_STREAK_HINTS = {
    "failed": "every completion scored 0: too hard for the model as it is, or a verifier that passes nothing "
    "(look at a few with `flywheel replay`), or a max_new_tokens too short for the answers",
    "solved": "every completion scored full marks: the domain is learned; lower its weight or give it harder tasks",
    "other": "every completion of each group scored the same: the verifier's rewards do not tell answers apart",
    "mixed": "each group all solved or all failed: the tasks are too easy or too hard for the model, none in between",
}


class SampleMaker:
    """A scored group's train samples, and the running reward and accuracy of the groups seen, per domain."""

    def __init__(self, ctx: ActorContext, config: LearnerConfig, policy: Policy, estimator: AdvantageEstimator) -> None:
        self.ctx, self.config, self.policy, self.estimator = ctx, config, policy, estimator
        self.rewards: dict[str, deque[tuple[float, float]]] = {}  # (mean reward, accuracy) of a domain's last groups
        self._unverified_logged: set[str] = set()  # domains whose unverified reference was logged
        self._streaks: dict[str, tuple[int, set[str]]] = {}  # a domain's groups in a row without signal, and why
        self.outcomes = OutcomeReporter(ctx)

    def make(self, msg: ScoredMsg) -> list[TrainSample] | None:
        """The group's samples (empty when every row is too long); None when it has no signal."""
        rewards = [c.reward for c in msg.completions]
        window = self.rewards.setdefault(msg.domain, deque(maxlen=REWARD_WINDOW))
        window.append((sum(rewards) / len(rewards), sum(r >= CORRECT for r in rewards) / len(rewards)))
        rows: list[tuple[list[int], list[float] | None]] = [(c.token_ids, c.logprobs) for c in msg.completions]
        guide = self._guidance(msg, rewards)
        if guide is not None:
            rows.append((guide, None))
            rewards = [*rewards, 1.0]
        if len(rewards) == 1:
            advantages: list[float] | None = [self.estimator.single(msg.domain, rewards[0])]
        else:
            advantages = self.estimator.group(msg.domain, rewards)
        self.ctx.counters.set("groups_skipped", self.estimator.groups_skipped)
        self.outcomes.add(msg.task_id, msg.origin, settled=advantages is None)
        if advantages is None:
            return None
        self._streaks.pop(msg.domain, None)
        if guide is not None:
            self.ctx.counters.inc(f"guided.{msg.domain}")
        limit = self.policy.max_context
        out = []
        for (token_ids, logprobs), advantage in zip(rows, advantages, strict=True):
            if not token_ids or len(msg.prompt_ids) + len(token_ids) > limit:
                self.ctx.counters.inc("too_long_skipped")
                continue
            out.append(TrainSample(msg.prompt_ids, token_ids, logprobs, advantage, msg.temperature))
        return out

    def _guidance(self, msg: ScoredMsg, rewards: list[float]) -> list[int] | None:
        """`failed_groups: reference`: the tokens of the task's reference answer (what the warm start trains on)
        for a group of several completions none of which is correct, else None. It joins the group with reward 1
        and no behavior logprobs (importance weight 1): the group then has signal, the reference a positive
        advantage and the failed completions a negative one (off-policy guidance, as LUFFY mixes demonstrations
        into GRPO).

        "None correct" is below full marks (`CORRECT`), not all 0: with a pass/fail verifier the same thing, with
        partial credit (json-fields: the share of fields right) a group whose best got half the fields is guided
        too. Such a group has signal without the reference, but only towards half answers; the reference shows
        the whole one (bench/RESULTS.md has the measurements).

        Only a reference its domain's verifier scored correct guides (``reference_reward``, set by the verify
        actor): one that fails (a wrong dataset row) or was never scored would teach a wrong answer as the right
        one. Such a group goes on without it, counted in ``reference_unverified.<domain>`` and logged at the first
        one per domain (the verify actor's ``reference_failed`` log says why the reference failed)."""
        domain = domains_of(self.ctx.spec).get(msg.domain)
        mode = getattr(domain, "failed_groups", None) or self.config.failed_groups  # the domain's, else the learner's
        if (
            mode != "reference"
            or len(rewards) < 2
            or max(rewards) >= CORRECT
            or not msg.reference
            or msg.origin != "domain"
        ):
            return None
        if msg.reference_reward is None or msg.reference_reward < CORRECT:
            self.ctx.counters.inc(f"reference_unverified.{msg.domain}")
            if msg.domain not in self._unverified_logged:
                self._unverified_logged.add(msg.domain)
                self.ctx.log.warning(
                    "learner.reference_unverified",
                    domain=msg.domain,
                    task_id=msg.task_id,
                    reference_reward=msg.reference_reward,
                    note="a failed group's reference was not scored correct by its verifier: not trained on "
                    "(counted in reference_unverified.<domain>; logged once per domain)",
                )
            return None
        return encode_completion(self.policy.tokenizer, msg.reference)

    def count_no_signal(self, msg: ScoredMsg) -> None:
        """Why a group carried no signal: all full marks (`no_signal_solved.<domain>`), all zero
        (`no_signal_failed`), or another shared reward (`no_signal_other`)."""
        rewards = [c.reward for c in msg.completions]
        kind = (
            "solved" if min(rewards, default=0.0) >= 1.0 else "failed" if max(rewards, default=0.0) <= 0.0 else "other"
        )
        self.ctx.counters.inc(f"no_signal_{kind}.{msg.domain}")
        streak, kinds = self._streaks.get(msg.domain, (0, set()))
        kinds.add(kind)
        self._streaks[msg.domain] = (streak + 1, kinds)
        if (streak + 1) % NO_SIGNAL_STREAK == 0:
            why = next(iter(kinds)) if len(kinds) == 1 else "mixed"
            self.ctx.log.warning(
                "learner.no_signal_streak", domain=msg.domain, groups=streak + 1, hint=_STREAK_HINTS[why]
            )
