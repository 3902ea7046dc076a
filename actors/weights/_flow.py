"""Versioned weight flow: the learner publishes, every generator watches and swaps in flight.

The current version's manifest lives in the KV bucket ``fw_<topology>_weights`` under key ``current`` (and,
with a promotion gate, ``serving``). Publishing = put the tensors through the transport, then the manifest into
KV; a manifest therefore never points at tensors that are not there yet. A collective transport (``announces =
True``, e.g. ``distributed``) is the exception: its receivers must be told to join *before* the tensors move, so
the manifest (carrying the rendezvous) goes first and the transport sends after (``put_announced``).

Guarantees:
- versions are monotonic: a publisher refuses a version ≤ the current one (read from the bus at its first publish,
  and again after a failed one; its own publishes since: the learner is the key's only writer); a subscriber of
  ``current`` ignores them, one of ``serving`` takes them (a rollback or a manual promotion moves it back);
- a subscriber that falls behind skips straight to the newest version (no replay of every intermediate one), and a
  fetch that takes over ``fetch_timeout_s`` is rejected (the next announcement is tried);
- a rejected payload (truncated, corrupted, wrong names/shapes/dtypes, non-finite values) or a failed load (an
  SGLang/vLLM server down or refusing it) is logged and counted, and the engine keeps serving the version it had; a
  load still running after ``slow_update_log_s`` is logged as ``weights.update_slow`` (a warning) that often, with
  how long it has waited, until it ends (an HTTP engine's own ``update_timeout_s`` bounds it);
- while the engine does not hold the newest announced version (it was rejected, or a restarted server lost it), that
  version is tried again, first after ``retry_s``, then less and less often (up to ``retry_max_s``), until it holds —
  unless its payload is gone for good (``WeightPayloadGone``: a shared-memory slot of the run before a resume, or one
  rewritten with a newer version): that is logged as ``weights.unavailable``, not counted, and the engine waits for
  the next announcement;
- a server that cannot load weights at all (``UnsupportedServerError``: an older release, a mode it was not started
  in) is not tried again on a timer: its reason is logged once as ``weights.unsupported`` (an error, saying what to
  run) and stays in :attr:`WeightSubscriber.failing`; each newer announcement is tried once (the server may have been
  replaced meanwhile), counted as rejected when it fails the same way.

Non-goals: no consensus about "which version is live everywhere" — status heartbeats report each generator's
version; the promotion gate decides what *serving* generators watch.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import torch

from actors.engines import Engine, UnsupportedServerError
from actors.protocol import CURRENT, SERVING, weights_bucket
from actors.weights._manifest import WeightManifest, WeightPayloadError, WeightPayloadGone
from actors.weights._transports import CollectiveTransport, SafetensorsDirTransport, WeightTransport
from topology.bus import Bus

__all__ = ["WeightPublisher", "WeightSubscriber"]


class WeightPublisher:
    def __init__(self, bus: Bus, topology: str, transport: WeightTransport, *, key: str = CURRENT) -> None:
        self._bus = bus
        self._bucket = weights_bucket(topology)
        self._transport = transport
        self._key = key
        self._newest: int | None = None  # the newest version under the key, once read: this publisher's own since
        self.last_publish_s = 0.0

    async def current(self) -> WeightManifest | None:
        raw = await self._bus.kv_get(self._bucket, self._key)
        return WeightManifest.from_json(raw) if raw else None

    async def newest(self) -> int:
        """The newest version under the key (0: none): read from the bus once, then kept as this publisher
        publishes — the learner is the key's only writer, so a publish costs no read of it."""
        if self._newest is None:
            current = await self.current()
            self._newest = current.version if current is not None else 0
        return self._newest

    async def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> WeightManifest:
        newest = await self.newest()
        if version <= newest:
            raise ValueError(f"weight versions are monotonic: cannot publish v{version} after v{newest}")
        started = time.perf_counter()
        try:
            if getattr(self._transport, "announces", False):  # collective transports: announce, then send
                collective: CollectiveTransport = self._transport  # type: ignore[assignment]
                manifest = await collective.put_announced(version, state_dict, self._announce)
            else:
                manifest = await self._transport.put(version, state_dict)
                await self._announce(manifest)
        except BaseException:
            self._newest = None  # a put the bus stored but never confirmed may hold the key: read it again
            raise
        self.last_publish_s = time.perf_counter() - started
        return manifest

    def close(self) -> None:
        """Let the transport free what it keeps between publishes (the shared-memory slots), where it keeps any."""
        close = getattr(self._transport, "close", None)
        if close is not None:
            close()

    async def _announce(self, manifest: WeightManifest) -> None:
        await self._bus.kv_put(self._bucket, self._key, manifest.to_json())
        self._newest = manifest.version

    async def point(self, manifest: WeightManifest, key: str) -> None:
        """Point another key (e.g. ``serving``) at an already published version — promotion and rollback."""
        await self._bus.kv_put(self._bucket, key, manifest.to_json())


class WeightSubscriber:
    """Watches one KV key and swaps every new version into ``engine`` between its decode steps."""

    def __init__(
        self,
        bus: Bus,
        topology: str,
        engine: Engine,
        transports: Mapping[str, WeightTransport],
        *,
        key: str = CURRENT,
        log: Any = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        served_key: str | None = None,
        fetch_timeout_s: float = 60.0,
        staging: SafetensorsDirTransport | None = None,
        retry_s: float = 2.0,
        retry_max_s: float = 60.0,
        slow_update_log_s: float = 60.0,
    ) -> None:
        self._bus = bus
        self.slow_update_log_s = slow_update_log_s  # an engine's load of one version still running is logged this often
        self._staging = staging  # directories staged for an engine that loads them (SGLang, vLLM)
        self._staged = 0
        self.fetch_timeout_s = fetch_timeout_s
        self.retry_s = retry_s  # first wait before a version the engine does not hold is tried again; doubles
        self.retry_max_s = retry_max_s  # up to this
        self._bucket = weights_bucket(topology)
        self._engine = engine
        self._transports = dict(transports)
        self._key = key
        self._log = log
        self._on_event = on_event
        self._served_key = served_key  # after each swap: {"version": v} under this key of the weights bucket
        self.applied = 0
        self.rejected = 0
        self.last_error = ""
        self._latest: int | None = None  # the newest version announced to run()
        self._gone: int | None = None  # the newest version whose payload was gone for good (not tried again)
        self._unsupported: int | None = None  # the newest version the server could not load at all (not tried again)
        self.last_swap_s = 0.0

    async def run(self) -> None:
        """Apply the current version (if newer than the engine's; under ``serving``, if another one), then the newest
        announced one, again and again.

        Announcements arriving while a swap is under way overwrite each other: the next swap takes the newest and
        the ones in between are skipped. Applying each in turn let a generator whose swap is slower than the
        learner's publishing fall further and further behind — until the objects it was reading had been deleted
        (the object store then kept two versions) and the read never finished, while the learner, seeing only stale
        samples, stopped publishing: the loop stood still.
        """
        newest: list[bytes] = []
        announced = anyio.Event()

        async def watch() -> None:
            async for raw in self._bus.kv_watch(self._bucket, self._key):
                newest[:] = [raw]
                announced.set()

        latest: WeightManifest | None = None  # the newest announced version, kept to try again
        retry_s = self.retry_s
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            while True:
                # a version the engine does not hold is tried again: a server that was down or restarting when it was
                # announced (or lost it in a restart since) gets it once it is back, without waiting for the next
                # version — which, before the first one, never comes: the learner waits for samples
                with anyio.move_on_after(math.inf if latest is None else retry_s):
                    await announced.wait()
                if announced.is_set():
                    announced = anyio.Event()
                    if not newest:  # empty when the newest arrived just before this round took it
                        continue
                    raw = newest.pop()
                    try:
                        latest = WeightManifest.from_json(raw)
                    except WeightPayloadError as exc:
                        self._reject(-1, str(exc))
                        continue
                    retry_s = self.retry_s
                    self._latest = latest.version
                elif latest is None or latest.version in (self._gone, self._unsupported) or self._holds(latest.version):
                    retry_s = self.retry_s  # held: look again in a moment (a restarted server drops it)
                    continue
                else:
                    retry_s = min(retry_s * 2, self.retry_max_s)  # a server refusing it again and again: less often
                await self.apply(latest)

    @property
    def _outlives_runs(self) -> bool:
        """The engine is a server of its own (SGLang, vLLM), which may hold another run's weights under any number."""
        return bool(getattr(self._engine, "loads_directories", False))

    def _holds(self, version: int) -> bool:
        """Whether the engine holds ``version``: its number, and (a server of its own) loaded by this subscriber — a
        number of another run's does not count."""
        return version == self._engine.version and (self.applied > 0 or not self._outlives_runs)

    @property
    def failing(self) -> str:
        """Why the engine does not hold the newest announced version ("" when it does, or none was announced yet):
        ``v<N>: <the last rejection's reason>``."""
        if self._latest in (None, self._gone) or not self.last_error or self._holds(self._latest):
            return ""
        return f"v{self._latest}: {self.last_error}"

    async def apply_raw(self, raw: bytes) -> bool:
        try:
            manifest = WeightManifest.from_json(raw)
        except WeightPayloadError as exc:
            self._reject(-1, str(exc))
            return False
        return await self.apply(manifest)

    async def apply(self, manifest: WeightManifest) -> bool:
        serving = self._engine.version
        # the serving key moves back too (a rollback, a manual promotion of an older version); and the first version
        # announced after a start replaces whatever the engine holds: an SGLang or vLLM server that outlived another
        # run reports that run's version, which would otherwise hold back every version of this one below it
        # (its number too: a server left at v1 by a run that ended there reports v1, and this run's v1 is other weights)
        fresh = self.applied == 0 and self._outlives_runs
        back = self._key == SERVING or self.applied == 0
        if (manifest.version == serving and not fresh) or (manifest.version < serving and not back):
            return False
        transport = self._transports.get(manifest.transport)
        if transport is None:
            self._reject(
                manifest.version,
                f"no transport {manifest.transport!r} configured here "
                f"(have: {', '.join(sorted(self._transports)) or 'none'})",
            )
            return False
        started = time.perf_counter()
        # An engine that keeps standby weights (the torch engine on a CPU) lets the transport read into them.
        fill_into = getattr(self._engine, "update_weights_from", None)
        try:
            # the engine validates names, shapes, dtypes and finite values before it touches its weights
            if fill_into is not None:
                with anyio.fail_after(self.fetch_timeout_s):  # a read that cannot finish must not stall the swaps
                    await fill_into(manifest.version, lambda into: transport.get(manifest, into=into))
            else:
                with anyio.fail_after(self.fetch_timeout_s):
                    source = await self._source(manifest, transport)
                # a server's load may take minutes: say so meanwhile (a task, not a task group: the load's own
                # errors are handled below as they are, not wrapped in a group)
                saying = asyncio.ensure_future(self._say_while_loading(manifest.version, time.monotonic()))
                try:
                    await self._engine.update_weights(manifest.version, source)
                finally:
                    saying.cancel()
        except TimeoutError:
            self._reject(manifest.version, f"fetching the weights took over {self.fetch_timeout_s:g} s")
            return False
        except WeightPayloadGone as exc:  # never loadable again: the next announcement is the one to take
            self._gone = manifest.version
            self._emit("weights.unavailable", {"version": manifest.version, "reason": str(exc)})
            return False
        except UnsupportedServerError as exc:  # no version loads until the server is replaced: say so once
            self._unsupported = manifest.version
            said = self.last_error == str(exc)
            self.rejected += 1
            self.last_error = str(exc)
            if not said:
                self._emit("weights.unsupported", {"version": manifest.version, "reason": str(exc)})
            return False
        except (WeightPayloadError, ValueError, RuntimeError, OSError) as exc:
            self._reject(manifest.version, str(exc))
            return False
        self.applied += 1
        self.last_swap_s = time.perf_counter() - started
        if self._served_key is not None:  # who serves what, at once (sync mode waits on it; heartbeats lag)
            try:
                await self._bus.kv_put(
                    self._bucket,
                    self._served_key,
                    json.dumps({"version": manifest.version, "ts": time.time()}).encode(),
                )
            except Exception as exc:  # informational: a failed put must not undo a good swap
                self._emit("weights.served_put_failed", {"version": manifest.version, "error": str(exc)})
        self._emit(
            "weights.swapped",
            {"version": manifest.version, "swap_s": round(self.last_swap_s, 4), "transport": manifest.transport},
        )
        return True

    async def _source(self, manifest: WeightManifest, transport: WeightTransport) -> Any:
        """What the engine loads the version from: its tensors; for an engine whose server reads a safetensors
        directory (SGLang, vLLM), a directory of this subscriber's ``staging``: the disk transport's files
        hard-linked in (the learner prunes its own directories while a server may still be opening them), the
        tensors of any other transport written there. Staged directories are numbered in the order they were
        staged, not by version: a rollback's older version must not be the one pruned."""
        if not getattr(self._engine, "loads_directories", False):
            return await transport.get(manifest)
        disk = isinstance(transport, SafetensorsDirTransport)
        if disk and not (Path(manifest.location) / "model.safetensors").is_file():
            raise WeightPayloadError(f"v{manifest.version}: {manifest.location} holds no model.safetensors")
        if self._staging is None:
            if disk:
                return manifest.location
            raise WeightPayloadError(
                f"v{manifest.version}: the {manifest.transport} transport gives tensors, the engine loads a directory, "
                "and this subscriber has no staging directory to write them to"
            )
        self._staged += 1
        if disk:
            return str(await self._staging.adopt(manifest.location, self._staged))
        return (await self._staging.put(self._staged, await transport.get(manifest))).location

    async def _say_while_loading(self, version: int, started: float) -> None:
        """Every ``slow_update_log_s`` while the engine loads ``version``: ``weights.update_slow`` with how long it
        has waited (an SGLang or vLLM server reading a large model; its own timeout ends the wait)."""
        for _ in iter(int, 1):  # until cancelled: the load finished or failed
            await anyio.sleep(self.slow_update_log_s)
            waited = round(time.monotonic() - started)
            self._emit("weights.update_slow", {"version": version, "waited_s": waited, "serving": self._engine.version})

    def _reject(self, version: int, reason: str) -> None:
        self.rejected += 1
        self.last_error = reason
        self._emit("weights.rejected", {"version": version, "reason": reason, "serving": self._engine.version})

    def _emit(self, event: str, fields: dict[str, Any]) -> None:
        if self._log is not None:
            level = {
                "weights.rejected": self._log.warning,
                "weights.unsupported": self._log.error,
                "weights.update_slow": self._log.warning,
            }
            level.get(event, self._log.info)(event, **fields)
        if self._on_event is not None:
            self._on_event(event, fields)
