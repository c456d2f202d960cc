"""The ``remote.Slots`` actor of each Dask worker, made once per run (``executors/dask.py``
calls them): an attempt is one call, straight to its worker.

Straight, when it can be: Dask sends an actor's calls through the scheduler unless the
client is told to reach workers itself (``direct_to_workers``).  ``Actors.route`` asks each
worker for its identity from here, and calls go direct only while every worker answered
(no hop through the scheduler, which shares the cores); one that cannot be reached from
here (a worker behind the scheduler's network) puts every call back through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

import trio

from dagrunner.executors import remote

WAIT_STEP = 1.0  # seconds between looks at whether the worker is still there
REACH_WAIT = 2.0  # seconds a worker has to answer the submitter straight, at its first look


class Actors:
    """Each worker's ``Slots``: its future from when it is asked for, the actor once made."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._made: dict[str, Any] = {}  # worker -> the future of its actor
        self._actors: dict[str, Any] = {}  # worker -> the actor, once made
        self._looked: set[str] = set()  # workers asked whether they answer from here
        # None: decide (Dask's config did not say); False: through the scheduler, for good
        import dask.config

        config = dask.config.get("distributed.client.direct-to-workers", None)
        self._direct: bool | None = None if config is None else bool(config)
        client.direct_to_workers = bool(config)

    @property
    def direct(self) -> bool:
        """Whether calls go straight to the workers (not through the scheduler)."""
        return bool(self._client.direct_to_workers)

    def route(self, places: list[str]) -> str:
        """Look whether each of ``places`` not looked at yet answers from here, and send the
        calls straight to the workers while all do; a warning when one does not ('' else).
        Called before a worker is placed on, so that no call goes straight to one that
        cannot be reached."""
        new = sorted(set(places) - self._looked)
        if not new or self._direct is False:
            self._looked.update(new)
            return ""
        reached = self._client.sync(self._reach, new)
        self._looked.update(new)
        cut_off = [p for p in new if p not in reached]
        if not cut_off:
            self._direct = self._client.direct_to_workers = True
            return ""
        self._direct = self._client.direct_to_workers = False
        return (
            f"worker {cut_off[0]} does not answer this machine straight (within {REACH_WAIT:g}s)"
            + (f", nor do {len(cut_off) - 1} more" if len(cut_off) > 1 else "")
            + ": attempts go through the Dask scheduler for the rest of the run"
        )

    async def _reach(self, places: list[str]) -> set[str]:
        async def one(place: str) -> str:
            try:
                await asyncio.wait_for(self._client.rpc(place).identity(), REACH_WAIT)
            except Exception:
                return ""
            return place

        return set(await asyncio.gather(*map(one, places))) - {""}

    def make(self, place: str) -> Any:
        """The future of ``place``'s actor, asked for now unless it was already."""
        with self._lock:
            if place not in self._made:
                self._made[place] = self._client.submit(
                    remote.Slots,
                    actor=True,
                    key=f"dagrunner-slots-{uuid.uuid4().hex[:12]}",
                    pure=False,
                    workers=[place],
                    allow_other_workers=False,
                )
            return self._made[place]

    def keep(self, places: set[str]) -> None:
        """Forget the actors of workers not in ``places`` (they left)."""
        with self._lock:
            for gone in set(self._made) - places:
                self._drop(gone)

    def drop(self, place: str, made: Any = None) -> None:
        """Forget ``place``'s actor (its calls fail): the next attempt there makes a new one.
        With ``made``, only if that is still the one asked for."""
        with self._lock:
            if made is None or self._made.get(place) is made:
                self._drop(place)

    def _drop(self, place: str) -> None:
        made = self._made.pop(place, None)
        self._actors.pop(place, None)
        if made is not None:
            with contextlib.suppress(Exception):
                made.release()

    async def get(self, place: str, present: Callable[[], bool]) -> Any:
        """``place``'s actor once it is made there; None when the worker left first (no
        longer ``present``) or the actor could not be made."""
        if place in self._actors:
            return self._actors[place]
        made = self.make(place)
        while True:
            try:
                actor = await trio.to_thread.run_sync(
                    made.result, WAIT_STEP, abandon_on_cancel=True
                )
            except TimeoutError:
                if present():
                    continue
                break
            except Exception:
                break
            with self._lock:
                if self._made.get(place) is made:
                    self._actors[place] = actor
            return actor
        self.drop(place, made)
        return None


class Answer:
    """The answer of one call, awaited on the client's event loop and told to this trio
    loop when it is there: no thread blocks on it (a thread per wait cost 0.5-0.8 ms a call
    here, beside a call of 1-2 ms)."""

    def __init__(self, call: Any, loop: asyncio.AbstractEventLoop) -> None:
        token = trio.lowlevel.current_trio_token()
        self._ready = trio.Event()

        async def wait() -> Any:
            return await call

        def tell(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._ready.set)

        self._future = asyncio.run_coroutine_threadsafe(wait(), loop)
        self._future.add_done_callback(tell)

    async def within(self, seconds: float) -> remote.Returned | None:
        """The answer, or None when it is not there within ``seconds``; a Dask error raises."""
        with trio.move_on_after(seconds):
            await self._ready.wait()
        if not self._future.done():
            return None
        try:
            done: remote.Returned = self._future.result()
        except (asyncio.CancelledError, CancelledError) as exc:  # the scheduler dropped it
            return remote.failed(f"worker-lost: the Dask scheduler dropped the call: {exc}"[:400])
        return done


def settle(call: Any) -> None:
    """Wait for a cancelled call to end, whatever it ended with."""
    try:
        call.result()
    except Exception:
        return
