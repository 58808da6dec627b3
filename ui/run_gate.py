"""Agent runs at once, and the line of runs waiting for one (issue 42, item 14).

gradio's queue refused a run past its bound with a bare "Queue is full" (HTTP 503 to an API client,
"This application is currently busy" in a toast of the page): nothing said when to come back, and a
run that got in waited behind every other one with no word of where it stood. The app keeps its own
line instead: :class:`RunGate` lets ``limit`` runs go at once (``--concurrency-limit``) and ``max_waiting``
wait (``ALI_QUEUE_MAX_SIZE``); a run past that is answered at once, in the Playground's status line
(and the API's status output), with what happened and when to try again (:meth:`RunGate.busy_text`); a
waiting run's status says its place in the line and about how long. The estimate is the median of the
last runs' durations (:data:`DEFAULT_RUN_S` before any has ended) times the rounds of ``limit`` runs
ahead. Everything here runs on the server's one event loop.
"""

from __future__ import annotations

import asyncio
import collections
import math
import statistics
import time

DEFAULT_RUN_S = 10.0  # a run's duration before any has been measured
RECENT_RUNS = 64  # durations the estimate is taken from
MIN_RETRY_S = 5  # the shortest "try again in" said


class Ticket:
    """One run's place: waiting, then admitted (holding a slot) until :meth:`RunGate.leave`."""

    __slots__ = ("admitted", "event", "started", "left")

    def __init__(self) -> None:
        self.admitted = False
        self.left = False
        self.event = asyncio.Event()
        self.started = 0.0


class RunGate:
    def __init__(self, limit: int, max_waiting: int) -> None:
        self.limit = max(1, int(limit))
        self.max_waiting = max(0, int(max_waiting))
        self.running = 0
        self.line: collections.deque[Ticket] = collections.deque()
        self.durations: collections.deque[float] = collections.deque(maxlen=RECENT_RUNS)
        self.refused = 0  # runs turned away since the start (for the log and the tests)

    # ---- the line ---------------------------------------------------------------------------------

    def join(self) -> Ticket | None:
        """A ticket (admitted at once when a slot is free), or None: the line is full."""
        if self.running < self.limit and not self.line:
            t = Ticket()
            self._admit(t)
            return t
        if len(self.line) >= self.max_waiting:
            self.refused += 1
            return None
        t = Ticket()
        self.line.append(t)
        return t

    def position(self, t: Ticket) -> int:
        """1 for the first in line (0 once admitted)."""
        if t.admitted:
            return 0
        try:
            return self.line.index(t) + 1
        except ValueError:
            return 0

    async def wait(self, t: Ticket, timeout: float) -> bool:
        """Wait at most ``timeout`` s for ``t`` to be admitted; whether it is."""
        if not t.admitted:
            try:
                await asyncio.wait_for(t.event.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return t.admitted

    def leave(self, t: Ticket) -> None:
        """The run ended (or its visitor left the line, or went away): its slot goes to the next."""
        if t.left:
            return
        t.left = True
        if t.admitted:
            self.running -= 1
            self.durations.append(time.monotonic() - t.started)
        else:
            try:
                self.line.remove(t)
            except ValueError:
                pass
        while self.running < self.limit and self.line:
            self._admit(self.line.popleft())

    def _admit(self, t: Ticket) -> None:
        t.admitted = True
        t.started = time.monotonic()
        self.running += 1
        t.event.set()

    # ---- what a visitor is told -------------------------------------------------------------------

    def run_seconds(self) -> float:
        return statistics.median(self.durations) if self.durations else DEFAULT_RUN_S

    def eta_s(self, position: int) -> float:
        """About how long the run at ``position`` in the line waits for a slot."""
        return math.ceil(position / self.limit) * self.run_seconds()

    def retry_s(self) -> int:
        """When a refused visitor should try again: about when the line has moved by a quarter
        of its length (rounded up to 5 s, at least :data:`MIN_RETRY_S`)."""
        s = self.eta_s(max(1, math.ceil(max(1, self.max_waiting) / 4)))
        return max(MIN_RETRY_S, int(math.ceil(s / 5.0) * 5))

    def busy_text(self) -> str:
        waiting = f"{len(self.line)} more are waiting for one" if self.max_waiting else "none can wait"
        return (f"The server is busy: all {self.limit} run slots are taken and {waiting} (the most it holds). "
                f"Your run was not started and your message is still in the box: try again in about {self.retry_s()} s. "
                f"The Inspector, Trace files and Template lab tabs work meanwhile.")

    def waiting_text(self, t: Ticket, since: float) -> str:
        pos = self.position(t)
        return (f"waiting for a free run slot: number {pos} in line ({self.running} running, {len(self.line)} waiting), "
                f"about {max(1, round(self.eta_s(pos)))} s · {time.monotonic() - since:.0f} s so far")
