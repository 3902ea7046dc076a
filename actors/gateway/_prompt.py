"""Requests of the OpenAI API as the gateway accepts them, and how they become prompt token ids.

Chat template (documented, deliberately simple):

* builtin tiny GPT (character tokenizer): one ``"<role>: <content>\\n"`` line per message, then
  ``"assistant: "`` — e.g. ``"system: be brief\\nuser: 2+2?\\nassistant: "``.
* ``hf:<dir>`` policies whose tokenizer has a chat template: ``apply_chat_template(messages,
  add_generation_prompt=True)`` rendered to text (a leading bos token string is stripped, since
  :func:`~actors.policy.encode_prompt` adds bos itself); without a chat template, the builtin rule.

Prompt ids are always ``encode_prompt(tokenizer, prompt_text)`` — the rule the generators and the learner
use — so the recorded ``prompt_ids`` are exactly what a replay or the learner rebuilds from the text.

Sampling parameters honoured: ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p``,
``stop``, ``seed``. ``n`` must be 1. Unknown fields are ignored (clients send many).

Non-goals: tools / function calling, images, ``logprobs`` in the response, ``echo``, ``best_of``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from actors.engines import SamplingParams, Tokenizer

__all__ = ["ChatRequest", "CompletionRequest", "PromptBuilder", "load_tokenizer"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": true} adds a usage chunk before [DONE]

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"only n=1 is supported, got {n}")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop must be at most 4 non-empty strings")
        return stop

    def wanted_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p, stop=stop, seed=self.seed
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")
        return self.content or ""


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _single(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError(f"exactly one prompt per request is supported, got {len(prompt)}")
        return prompt

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class PromptBuilder:
    """Renders chat messages and encodes prompts with the policy's tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from actors.policy import encode_prompt

        self.tokenizer = tokenizer
        self._encode_prompt = encode_prompt
        hf = getattr(tokenizer, "hf", None)
        self._hf = hf if getattr(hf, "chat_template", None) else None

    def chat_text(self, messages: list[ChatMessage]) -> str:
        if self._hf is not None:
            rendered = self._hf.apply_chat_template(
                [{"role": m.role, "content": m.text()} for m in messages], tokenize=False, add_generation_prompt=True
            )
            bos = getattr(self._hf, "bos_token", None)
            text = str(rendered)
            return text[len(bos) :] if bos and text.startswith(bos) else text
        return "".join(f"{m.role}: {m.text()}\n" for m in messages) + "assistant: "

    def encode(self, text: str) -> list[int]:
        return self._encode_prompt(self.tokenizer, text)


def load_tokenizer(policy_spec: Any, spec_dir: Path) -> Tokenizer:
    """The policy's tokenizer without its weights: the builtin character tokenizer, or the ``hf:<dir>``
    model's tokenizer (local files only: a directory, or a hub id in the machine's Hugging Face cache). Errors are
    one-line ``ValueError``s."""
    model = str(getattr(policy_spec, "model", "builtin:tiny-gpt"))
    if model.startswith("builtin:"):
        from actors.policy import CharTokenizer

        return CharTokenizer()
    if model.startswith("hf:"):
        path = Path(model[3:]).expanduser()
        if not path.is_absolute() and not path.exists() and (spec_dir / path).exists():  # relative to the spec
            path = spec_dir / path
        try:
            import transformers

            from actors.policy import HFTokenizer, model_directory

            directory = model_directory(path)  # a directory, or a hub id in this machine's Hugging Face cache
            return HFTokenizer(transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
        except (OSError, ValueError) as exc:
            raise ValueError(f"policy.model: cannot load the tokenizer of {model!r}: {exc}") from None
    raise ValueError(f"policy.model: expected 'builtin:tiny-gpt' or 'hf:<model dir>', got {model!r}")
