"""Ends a process whose transfers wait for their peers longer than the timeout.

The copy-engine backend waits for its peers' signals with stream memory operations
(runtime/distributed/signals.py), which wait on the GPU for as long as it takes: a dead peer would
leave the stream, and every host synchronisation behind it, waiting forever. The
watchdog is a host thread that looks at the transfers in flight every `period_s`; each
is a pair of CUDA events, recorded before its waits and after its copies. A transfer's
clock starts when its first event has passed on the GPU (the work queued before it
takes as long as it takes), and one still unfinished `timeout_s` later expires: the
watchdog calls `on_expiry` with a message that says which transfer.

On GPUs `on_expiry` is `end_process`: it writes the message to stderr and ends the
process with status 1, as torch's NCCL watchdog ends a process whose collective timed
out. Nothing less works: a stream blocked in a memory wait stays blocked, and a failing
device-side assert launched beside it did not release a synchronisation blocked behind
the wait (tried on 2 H200).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Watched:
    """One transfer in flight: its events and since when (host clock) its first one has passed."""

    started: object
    finished: object
    what: str
    since: float | None = None


class Watchdog:
    """Watches transfers in flight on one device; a thread runs while there are any."""

    def __init__(
        self,
        timeout_s: float,
        on_expiry: Callable[[str], object],
        period_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.timeout_s = timeout_s
        self.on_expiry = on_expiry
        self.period_s = period_s
        self.clock = clock
        self._watched: list[Watched] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, started, finished, what: str) -> None:
        """Watches the GPU work between the events `started` and `finished` (CUDA events, or
        anything with their `query`); `what` names it in the message of an expiry."""
        with self._lock:
            self._watched.append(Watched(started, finished, what))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hostir-watchdog", daemon=True)
                self._thread.start()

    def check(self) -> bool:
        """One look at the transfers in flight: forgets the finished ones, expires those that
        waited too long. Whether any is left to watch."""
        now, expired = self.clock(), []
        with self._lock:
            remaining = []
            for watched in self._watched:
                if watched.finished.query():
                    continue
                if watched.since is None and watched.started.query():
                    watched.since = now
                if watched.since is not None and now - watched.since > self.timeout_s:
                    expired.append(watched)
                else:
                    remaining.append(watched)
            self._watched = remaining
            if not remaining:
                self._thread = None
        for watched in expired:
            self.on_expiry(
                f"{watched.what} has waited more than {self.timeout_s:g} s for its peers: a peer "
                "is dead, stuck, or not running the same program"
            )
        return bool(remaining)

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            if not self.check():
                return


def end_process(rank: int, message: str) -> None:
    """Says `message` on stderr and ends the process with status 1."""
    print(f"hostir: rank {rank}: {message}; ending the process", file=sys.stderr, flush=True)
    os._exit(1)
