"""The watchdog of the copy engines' transfers (`runtime.distributed.watchdog`), with stand-in events.

On GPUs the events are CUDA events and an expiry ends the process; test_copy_engine.py
runs that with a peer that never signals. Here the events are flags the test sets, and
the clock is the test's, so each rule shows exactly: a transfer's clock starts when its
first event has passed, it expires once, `timeout_s` after that, and a finished one is
forgotten.
"""

from __future__ import annotations

import threading

from hostir.runtime.distributed import watchdog as watchdog_module
from hostir.runtime.distributed.watchdog import Watchdog


class Flag:
    """Stands in for a CUDA event: `query` says whether the GPU has passed it."""

    def __init__(self) -> None:
        self.passed = False

    def query(self) -> bool:
        return self.passed


def test_a_transfer_expires_once_timeout_s_after_it_started_on_the_gpu():
    now, expiries = [0.0], []
    watchdog = Watchdog(2.0, expiries.append, period_s=3600, clock=lambda: now[0])
    started, finished = Flag(), Flag()
    watchdog.watch(started, finished, "rank 0: an allgather in the team [0, 1] (backend cuda)")
    # Queued behind other work, it has not started: however long that takes, no expiry.
    now[0] = 100.0
    assert watchdog.check() and expiries == []
    started.passed = True
    assert watchdog.check()  # its clock starts now, at 100 s
    now[0] = 102.0
    assert watchdog.check() and expiries == []
    now[0] = 102.5
    assert not watchdog.check(), "an expired transfer is no longer watched"
    assert expiries == [
        "rank 0: an allgather in the team [0, 1] (backend cuda) has waited more than 2 s for its "
        "peers: a peer is dead, stuck, or not running the same program"
    ]
    now[0] = 200.0
    watchdog.check()
    assert len(expiries) == 1


def test_finished_transfers_are_forgotten_and_the_others_still_watched():
    now, expiries = [0.0], []
    watchdog = Watchdog(1.0, expiries.append, period_s=3600, clock=lambda: now[0])
    transfers = [(Flag(), Flag()) for _ in range(3)]
    for k, (started, finished) in enumerate(transfers):
        started.passed = True
        watchdog.watch(started, finished, f"transfer {k}")
    watchdog.check()
    transfers[0][1].passed = transfers[2][1].passed = True
    now[0] = 5.0
    assert not watchdog.check()
    assert [message.split(" has ")[0] for message in expiries] == ["transfer 1"]


def test_the_thread_expires_a_stuck_transfer_on_its_own_and_then_ends():
    expired = threading.Event()
    watchdog = Watchdog(0.05, lambda message: expired.set(), period_s=0.01)
    started, finished = Flag(), Flag()
    started.passed = True
    watchdog.watch(started, finished, "a stuck transfer")
    thread = watchdog._thread
    assert thread is not None and thread.is_alive()
    assert expired.wait(timeout=10), "no expiry within 10 s of a 0.05 s timeout"
    thread.join(timeout=10)
    assert not thread.is_alive() and watchdog._thread is None, "the thread goes on with nothing to watch"
    # A later transfer starts a thread of its own.
    expired.clear()
    watchdog.watch(started, finished, "another stuck transfer")
    second = watchdog._thread
    assert second is not None and second is not thread
    assert expired.wait(timeout=10)
    second.join(timeout=10)
    assert not second.is_alive()


def test_an_expiry_on_gpus_says_which_rank_and_ends_the_process_with_status_1(monkeypatch, capsys):
    exits = []
    monkeypatch.setattr(watchdog_module.os, "_exit", exits.append)
    watchdog_module.end_process(3, "a transfer has waited more than 2 s for its peers")
    assert exits == [1]
    assert capsys.readouterr().err == (
        "hostir: rank 3: a transfer has waited more than 2 s for its peers; ending the process\n"
    )
