"""``python -m actors.testing sglang|vllm``: a fake SGLang or vLLM server in a process of its own.

It stands in for the real server where there is none (no GPU): a spec with ``engine: sglang`` (or ``vllm``) and its
``url`` runs against it as against the real one — generation, logprobs, weight updates, pause and resume in the
servers' HTTP shapes. ``--model`` takes what the spec's ``policy.model`` says (``builtin:tiny-gpt``, ``hf:DIR``);
the generated text comes from that model on the CPU. It serves until Ctrl-C (or SIGTERM).

Non-goals: a server for anything but tests and rehearsals (one process, one CPU thread pool).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

_DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000}  # the real servers' default ports


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m actors.testing",
        description="Serve a fake SGLang or vLLM server (a real torch model on the CPU) until Ctrl-C.",
    )
    parser.add_argument("server", choices=sorted(_DEFAULT_PORTS), help="which server's HTTP API to speak")
    parser.add_argument(
        "--model", default="builtin:tiny-gpt", help="as the spec's policy.model (builtin:tiny-gpt, hf:DIR)"
    )
    parser.add_argument("--port", type=int, default=None, help="default: the real server's (sglang 30000, vllm 8000)")
    parser.add_argument(
        "--api-key", default=None, help="as the real servers' --api-key: requests without it are refused (401)"
    )
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    from actors.engines import TorchEngine
    from actors.policy import Policy
    from actors.testing import FakeSGLangServer, FakeVLLMServer

    policy = Policy.from_spec({"model": args.model})
    fake = FakeSGLangServer if args.server == "sglang" else FakeVLLMServer
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with fake(TorchEngine(policy), port=args.port, api_key=args.api_key) as server:
        print(f"fake {args.server} serving {args.model} at {server.url} (in a spec: url: {server.url})", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.port is None:
        args.port = _DEFAULT_PORTS[args.server]
    try:
        asyncio.run(_serve(args))
    except ValueError as exc:  # a model that cannot be loaded: Policy.from_spec's one-line reason
        print(f"python -m actors.testing: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken
        print(
            f"python -m actors.testing: cannot serve on port {args.port}: {exc.strerror or exc} (--port picks another)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
