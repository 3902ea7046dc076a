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
``stop`` (the answer ends before it, as the OpenAI API says; the traffic record keeps it), ``seed``; null for any of
them is its default. ``n`` must be 1. Types are strict (``"stream": "yes"`` is a 400, not a stream). A chat template
that refuses the messages (roles that do not alternate) is a 400 naming ``messages``, in the template's words. A
chat message's content is a string or a list of text parts (``{"type": "text", "text": …}``); any other part
(``image_url``, ``input_audio``, ``file``, …) is a 400 whose ``param`` names it (``messages.0.content.1.type``): the
engines read text only, and an answer that silently left the image out would look like an answer to it. Fields this
gateway cannot honour (`UNSUPPORTED`: ``logprobs``, ``tools``, ``tool_choice``, penalties, ``echo``, audio,
``top_k``, …) are a 400 that names the field when set to anything but their no-op value (clients send ``logprobs:
false`` or ``frequency_penalty: 0`` by habit; an answer that ignored a real one would look served as asked); a
refused value is shown cut short. Other unknown fields are ignored (clients send many).

Non-goals: tools / function calling, images, ``logprobs`` in the response, ``echo``, ``best_of``, penalties,
``logit_bias``, structured output (``response_format``).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from actors.engines import SamplingParams, Tokenizer

__all__ = ["ChatRequest", "ChatTemplateError", "CompletionRequest", "PromptBuilder"]


def _is_no_op(field: str, value: Any) -> bool:
    if field == "response_format":
        return value is None or (isinstance(value, dict) and value.get("type", "text") == "text")
    if field == "logprobs":  # a completions request's logprobs: 0 asks for the chosen tokens' logprobs
        return value is None or value is False
    if field == "repetition_penalty" and value in (0, 0.0):  # a factor: 0 is no no-op
        return False
    return value in (None, False, 0, "", [], {}) or value in _NO_OP_VALUES.get(field, ())


def _shown(value: Any) -> str:
    """A client's value in an error message, as JSON, cut short (a value of any size or depth is shown so)."""
    try:
        text = orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # nested deeper than the encoder goes
        text = f"a {type(value).__name__} nested too deep to show"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


# fields of the OpenAI API this gateway does not implement → what it would take to honour them
UNSUPPORTED_PARAMETER = "unsupported_parameter"  # the error type (and code) of a field in UNSUPPORTED
UNSUPPORTED_VALUE = "unsupported_value"  # the error type (and code) of a value the gateway cannot serve (an image)
UNSUPPORTED = {
    "logprobs": "this gateway does not return logprobs",
    "top_logprobs": "this gateway does not return logprobs",
    "echo": "this gateway does not echo the prompt",
    "best_of": "this gateway samples one completion per request",
    "suffix": "this gateway does not insert between a prompt and a suffix",
    "tools": "this gateway does not call tools",
    "functions": "this gateway does not call tools",
    "logit_bias": "this gateway does not bias logits",
    "presence_penalty": "this gateway does not apply penalties",
    "frequency_penalty": "this gateway does not apply penalties",
    "response_format": "this gateway does not constrain the output's format",
    "tool_choice": "this gateway does not call tools",
    "function_call": "this gateway does not call tools",
    "parallel_tool_calls": "this gateway does not call tools",
    "modalities": "this gateway answers in text only",
    "audio": "this gateway answers in text only",
    "prediction": "this gateway does not take predicted outputs",
    "top_k": "this gateway samples with temperature and top_p only",
    "min_p": "this gateway samples with temperature and top_p only",
    "min_tokens": "this gateway does not hold back the end of a completion",
    "ignore_eos": "this gateway does not hold back the end of a completion",
    "repetition_penalty": "this gateway does not apply penalties",
}
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {  # beyond null, false, 0 and empty: what asks for nothing
    "best_of": (1,),
    "tool_choice": ("none", "auto"),  # with no tools, "auto" calls none
    "modalities": (["text"],),
    "top_k": (-1,),
    "repetition_penalty": (1, 1.0),
}
_SHOWN_CHARS = 200  # of a refused value, in its error message


class _Request(BaseModel):
    # strict: a string is no number and no boolean ("stream": "yes" streamed), a boolean no count ("max_tokens": true
    # was 1), as the OpenAI API types them; an integer is still a number
    model_config = ConfigDict(extra="allow", strict=True)
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

    @field_validator("temperature", "top_p", "n", "stream", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """The API types these "or null", and the official SDK sends null for a None: the default."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

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

    @model_validator(mode="after")
    def _supported(self) -> _Request:
        for field, value in (self.model_extra or {}).items():
            if field in UNSUPPORTED and not _is_no_op(field, value):
                shown = _shown(value)
                raise PydanticCustomError(  # the field rides along: the error's param names it
                    UNSUPPORTED_PARAMETER,
                    "{field}: {why}; got {shown} (leave it out, or null)",
                    {"field": field, "why": UNSUPPORTED[field], "shown": shown},
                )
        return self

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def wanted_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stops(),
            seed=self.seed,
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

    @model_validator(mode="after")
    def _text_parts_only(self) -> ChatRequest:
        for m, message in enumerate(self.messages):
            for p, part in enumerate(message.content if isinstance(message.content, list) else ()):
                kind = part.get("type")
                if kind != "text":
                    shown = _shown(kind)
                    raise PydanticCustomError(  # the part rides along: the error's param names it
                        UNSUPPORTED_VALUE,
                        "{field}: only text content parts are supported (this gateway's models read text), got {shown}",
                        {"field": f"messages.{m}.content.{p}.type", "shown": shown},
                    )
                if not isinstance(part.get("text"), str):
                    raise PydanticCustomError(
                        "value_error",
                        "{field}: a text part needs its text as a string",
                        {"field": f"messages.{m}.content.{p}.text"},
                    )
        return self


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


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (its own words, e.g. "Conversation roles must alternate")."""


class PromptBuilder:
    """Renders chat messages and encodes prompts with the policy's tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from actors.policy import encode_prompt

        self.tokenizer = tokenizer
        self._encode_prompt = encode_prompt
        hf = getattr(tokenizer, "hf", None)
        self._hf = hf if getattr(hf, "chat_template", None) else None

    def chat_text(self, messages: list[ChatMessage]) -> str:
        """The prompt text of ``messages``. A chat template that refuses them (many raise on roles that do not
        alternate, or on a system message) is the client's error: :class:`ChatTemplateError` with its message."""
        if self._hf is not None:
            from jinja2 import TemplateError

            try:
                rendered = self._hf.apply_chat_template(
                    [{"role": m.role, "content": m.text()} for m in messages],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            except (TemplateError, ValueError) as exc:
                raise ChatTemplateError(str(exc)[:_SHOWN_CHARS] or type(exc).__name__) from None
            bos = getattr(self._hf, "bos_token", None)
            text = str(rendered)
            return text[len(bos) :] if bos and text.startswith(bos) else text
        return "".join(f"{m.role}: {m.text()}\n" for m in messages) + "assistant: "

    def encode(self, text: str) -> list[int]:
        return self._encode_prompt(self.tokenizer, text)
