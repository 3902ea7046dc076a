"""Config of the `generator` actor kind (light module: no torch; registers the kind on import).

A generator turns prompts into completions (token ids, behavior logprobs, weight version per token) with
one engine — the builtin torch engine, or an SGLang/vLLM server over HTTP — and swaps in new weights
while it runs. With ``serve: true`` it also answers the gateway's requests (the gateway records them on `traffic`).
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from actors.protocol import cuda_missing_here, policy_of
from topology import ActorKind, ActorSpec, KeyPath, SectionCheck, Spec, SpecModel, register_actor_kind, show


class GeneratorConfig(SpecModel):
    """Fields of a `generator` actor block (besides kind/replicas/resources/consumes/publishes)."""

    engine: Literal["torch", "sglang", "vllm"] = "torch"  # torch: in-process; sglang/vllm: a running server
    #   (vllm: 0.20 or newer, started with VLLM_SERVER_DEV_MODE=1: its dev-mode routes load the new weights)
    url: str | None = None  # base URL of the sglang/vllm server (http://host:30000); required for those engines
    device: Literal["auto", "cpu", "cuda"] = "auto"  # torch engine: where the model runs; auto = cuda if present
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # torch engine: weights and activations
    # sequences decoded together; new requests join at step boundaries (HTTP engines: requests in flight to the
    # server). 128 trained the most samples/s of 32, 64 and 128 on 2 CPU cores (bench/RESULTS.md); the GPU specs
    # set 256
    max_batch_size: int = Field(default=128, ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)  # cap per completion; null: each domain's max_new_tokens
    temperature: float = Field(default=1.0, ge=0)  # sampling temperature (the learner must see the same one)
    top_p: float = Field(default=1.0, gt=0, le=1)  # nucleus sampling; 1 = off
    top_k: int = Field(default=0, ge=0)  # top-k sampling; 0 = off
    serve: bool = False  # also answer the gateway's requests (over core NATS request/reply)
    weight_sync: Literal["object-store", "disk", "shm", "distributed"] = "object-store"  # how new weights arrive;
    #   distributed (the learner's broadcast group): the torch engine only — an SGLang or vLLM generator loads each
    #   version from a directory on its node
    follow: Literal["current", "serving"] = "current"  # current: every version the learner publishes;
    #   serving: only versions the promotion gate promoted (for generators that answer users)
    request_timeout_s: float = Field(default=120.0, gt=0)  # sglang/vllm: HTTP timeout per request
    # sglang/vllm: how long a starting generator waits for its server to answer (it may still be loading the model),
    # saying in its log what it waits for; then it fails, naming the url
    server_start_timeout_s: float = Field(default=600.0, gt=0)
    # sglang/vllm: how long the server may take to load one version of the weights (a large model read from disk);
    # a load still running is logged every minute, and one past this is rejected: the server keeps what it had
    weight_update_timeout_s: float = Field(default=600.0, gt=0)
    # sglang/vllm: the environment variable holding the server's API key (a server started with --api-key), sent as
    # a Bearer token; the key itself stays out of the spec
    api_key_env: str | None = None

    @field_validator("api_key_env")
    @classmethod
    def _a_variable_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):  # not echoed: it may be the key
            raise ValueError(
                "expected the name of an environment variable (letters, digits, _) that holds the server's key, not "
                "the key itself"
            )
        return value

    @model_validator(mode="after")
    def _url_matches_engine(self) -> GeneratorConfig:
        if self.engine in ("sglang", "vllm") and self.url is None:
            raise ValueError(f"expected url: http://host:port with engine: {self.engine}, got no url")
        if self.engine == "torch" and self.url is not None:
            raise ValueError(f"expected no url with engine: torch (url is for sglang/vllm), got {show(self.url)}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// url, got {show(self.url)}")
        if self.engine == "torch" and self.api_key_env is not None:
            raise ValueError(
                f"expected no api_key_env with engine: torch (it is an sglang/vllm server's key), got "
                f"{show(self.api_key_env)}"
            )
        return self


def _check(check: SectionCheck, path: KeyPath, actor: ActorSpec, spec: Spec) -> BaseModel:
    config = actor.config
    assert isinstance(config, GeneratorConfig)
    model = policy_of(spec).model
    if config.engine != "torch" and not model.startswith("hf:"):  # the generator tokenizes with the model's own
        check.error(
            (*path, "engine"),
            f"expected engine: torch with policy.model {model} ({check.where(('policy', 'model'))}): sglang and "
            f"vllm serve an hf:<model dir or hub id> policy, whose tokenizer the generator loads; got "
            f"{show(config.engine)}",
        )
    if config.engine != "torch" and config.weight_sync == "distributed":
        check.error(
            (*path, "weight_sync"),
            f"expected object-store, disk or shm with engine: {config.engine}: an {config.engine} server does not join "
            "the learner's broadcast (not built yet), so this generator would never get a version; got 'distributed'",
        )
    no_cuda = cuda_missing_here(config, spec)
    if no_cuda:
        check.error((*path, "device"), no_cuda, warning=True)
    if config.api_key_env is not None and not os.environ.get(config.api_key_env):
        check.error(
            (*path, "api_key_env"),
            f"{config.api_key_env} is not set here: the generator reads the server's key from it when it starts and "
            "stops at every start without it; fine if the spec is for another machine",
            warning=True,
        )
    return config


register_actor_kind(
    ActorKind(
        name="generator",
        config=GeneratorConfig,
        factory="actors.generator._actor:GeneratorActor",
        consumes=("prompts",),
        publishes=("rollouts",),
        summary="samples completions for prompts (torch, SGLang or vLLM engine); swaps weights in flight",
        check=_check,
    )
)

__all__ = ["GeneratorConfig"]
