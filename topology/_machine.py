"""What this machine can give: CPU count and visible GPUs (without importing torch), and the warnings
for a spec that asks for more.

Contract: `visible_gpus()` counts GPUs from ``CUDA_VISIBLE_DEVICES`` when set, else from ``nvidia-smi -L``
when that tool exists (2 s timeout), else 0; the answer is cached per process. `machine_issues(spec)`
returns ``(key path, message)`` pairs — warnings only, since a spec may be written for another machine.
`bind_problem(host, port)` says what would stop a listener on ``host:port`` here now (another process listening
there, an address this machine does not have), or None; it binds the way servers do (``SO_REUSEADDR``: a port
whose last connections are only closing is free).

Non-goals: AMD/Intel accelerators, memory checks, Ray cluster capacity (a Ray spec's resources are the
cluster's business).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import socket
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topology._spec import Spec
    from topology._yaml import KeyPath


@functools.cache
def visible_gpus() -> int:
    """Number of NVIDIA GPUs this process could use."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip() and e.strip() != "-1"]
        return len(entries)
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return 0
    try:
        listing = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def machine_issues(spec: Spec, *, cpus: int | None = None, gpus: int | None = None) -> list[tuple[KeyPath, str]]:
    """Warnings for resources beyond this machine (per replica, and summed over all replicas)."""
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    gpus = visible_gpus() if gpus is None else gpus
    found: list[tuple[KeyPath, str]] = []
    total_cpus = 0.0
    total_gpus = 0.0
    for actor in spec.actors.values():
        total_cpus += actor.resources.num_cpus * actor.replicas
        total_gpus += actor.resources.num_gpus * actor.replicas
        if actor.resources.num_cpus > cpus:
            found.append(
                (
                    ("actors", actor.name, "resources", "num_cpus"),
                    f"one replica asks for {actor.resources.num_cpus:g} CPU(s); this machine has {cpus}",
                )
            )
        if actor.resources.num_gpus > gpus:
            found.append(
                (
                    ("actors", actor.name, "resources", "num_gpus"),
                    f"one replica asks for {actor.resources.num_gpus:g} GPU(s); this machine has {gpus} visible",
                )
            )
    if total_cpus > cpus:
        found.append(
            (
                ("actors",),
                f"actors ask for {total_cpus:g} CPUs in total (num_cpus × replicas); this machine "
                f"has {cpus}, so replicas will share cores",
            )
        )
    if total_gpus > gpus and not any(p[-1] == "num_gpus" for p, _ in found):
        found.append(
            (
                ("actors",),
                f"actors ask for {total_gpus:g} GPUs in total (num_gpus × replicas); this machine has {gpus} visible",
            )
        )
    return found


__all__ = ["machine_issues", "visible_gpus"]


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` of this machine now, or None when it could (see the module
    docstring). Port 0 (any free one) is always possible."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host} does not resolve here ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is in use by another process"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is no address of this machine"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None
