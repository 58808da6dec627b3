"""What gradio keeps per session, bounded (issue 42, item 14).

gradio 6.31 keeps a ``SessionState`` for every session it has seen (``StateHolder``, up to
``state_session_capacity`` = 10,000 by default): a copy of every component's config, ~0.35 MB on this
app's page, plus the session's own state (its runs' traces). A call of the HTTP API without a session
of its own (``POST /gradio_api/call/NAME``, then ``GET .../NAME/EVENT_ID``) is a session of one event
whose id is the event's: nothing can reach it again once its answer is sent, yet it was kept, so 1,000
visitors calling the API grew the app by hundreds of MB. Here:

* :class:`DropOneShotSessions` lets gradio forget such a session once its answer stream has ended (the
  state only: the files the answer points to, a run's trace file, stay downloadable, as before, until
  the app's temp folder is cleared);
* :func:`max_sessions`: ``ALI_MAX_SESSIONS`` (default :data:`MAX_SESSIONS`) sessions held at most, the
  least recently used dropped past it (gradio's ``state_session_capacity``): a bound on browser tabs and
  ``gradio_client`` sessions, which name their own session.
"""

from __future__ import annotations

import os
import re
from typing import Any

MAX_SESSIONS = 1000  # ~0.35 GB of gradio's per-session config copies at most (issue 42: 0.35 MB each)
_STREAM = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/([0-9a-f]{16,64})/?$")


class _LazyConfigs(dict):
    """gradio's ``SessionState.config_values`` (block id -> that block's config, for deep links),
    each block's built when first read or written instead of all ~200 when the session is made: a
    session pays for the blocks its events touched, not ~40 ms and ~0.35 MB for the whole page.
    Reading all of it (a deep link) builds the rest."""

    def __init__(self, blocks_config: Any, keys: Any) -> None:
        super().__init__()
        self._config = blocks_config
        self._pending = set(keys)

    def _build(self, key: Any) -> Any:
        self._pending.discard(key)
        value = self._config.config_for_block(key, [], self._config.blocks[key])
        dict.__setitem__(self, key, value)
        return value

    def _build_all(self) -> None:
        for key in list(self._pending):
            self._build(key)

    def __missing__(self, key: Any) -> Any:
        if key in self._pending:
            return self._build(key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._pending

    def __setitem__(self, key: Any, value: Any) -> None:
        self._pending.discard(key)
        dict.__setitem__(self, key, value)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._pending)

    def __iter__(self):  # type: ignore[override]
        self._build_all()
        return dict.__iter__(self)

    def items(self):  # type: ignore[override]
        self._build_all()
        return dict.items(self)

    def keys(self):  # type: ignore[override]
        self._build_all()
        return dict.keys(self)

    def values(self):  # type: ignore[override]
        self._build_all()
        return dict.values(self)


def light_state_holder(app: Any) -> None:
    """Make the sessions gradio creates from now on build their block configs lazily
    (:class:`_LazyConfigs`). Checked against gradio 6.31's ``SessionState``; a gradio whose
    ``SessionState`` does not build ``config_values`` in its constructor is left as it is."""
    from copy import copy

    from gradio import state_holder as sh

    holder = getattr(app, "state_holder", None)
    if holder is None or type(holder) is not sh.StateHolder or "config_values" not in sh.SessionState.__init__.__code__.co_names:
        return

    class LightSessionState(sh.SessionState):
        def __init__(self, blocks: Any) -> None:  # SessionState's attributes, config_values lazily
            self.blocks_config = copy(blocks.default_config)
            self.config_values = _LazyConfigs(self.blocks_config, [k for k in self.blocks_config.blocks if k in blocks.blocks])
            self.state_data = {}
            self._state_ttl = {}
            self.is_closed = False
            self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600

    class LightStateHolder(sh.StateHolder):
        def __getitem__(self, session_id: str) -> Any:
            if session_id not in self.session_data:
                self.session_data[session_id] = LightSessionState(self.blocks)
            return super().__getitem__(session_id)

    holder.__class__ = LightStateHolder


def lifespan(inner: Any = None) -> Any:
    """A ``lifespan`` for the app gradio creates: :func:`light_state_holder` when the server starts."""
    import contextlib

    @contextlib.asynccontextmanager
    async def span(app: Any):
        light_state_holder(app)
        if inner is not None:
            async with inner(app) as state:
                yield state
        else:
            yield None

    return span


def max_sessions(environ: dict[str, str] | None = None) -> int:
    """``ALI_MAX_SESSIONS`` (a positive integer), else :data:`MAX_SESSIONS`."""
    raw = (os.environ if environ is None else environ).get("ALI_MAX_SESSIONS", "").strip()
    try:
        n = int(raw) if raw else MAX_SESSIONS
    except ValueError:
        n = MAX_SESSIONS
    return n if n > 0 else MAX_SESSIONS


class DropOneShotSessions:
    """ASGI middleware: after ``GET /gradio_api/call/NAME/EVENT_ID`` has streamed its answer, the
    session named by that event id (a call that sent no session of its own) is dropped from gradio's
    ``StateHolder``. A caller that named its own session keeps it (its hash is not the event's id)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        m = _STREAM.search(scope.get("path", "")) if scope["type"] == "http" and scope.get("method") == "GET" else None
        try:
            await self.app(scope, receive, send)
        finally:
            if m is not None:
                drop_session(scope.get("app"), m.group(1))


BUSY_WORDS = ("The server is busy: {n} requests are waiting, the most it holds. Nothing was started: "
              "try again in about {s} s.")
BUSY_RETRY_S = 10


class BusyWords:
    """ASGI middleware: gradio's refusal when its queue is full (HTTP 503 ``{"detail": "Queue is full.
    Max size is 64 and size is 64."}`` from ``/gradio_api/queue/join`` and ``/gradio_api/call/NAME``)
    said in words: what happened and when to try again (``detail``, and a ``Retry-After`` header).
    The page's own client shows gradio's "This application is currently busy. Please try again." for
    any 503 (its text is in gradio's JavaScript); the page's head script (``ui/assets/busy.js``)
    shows these words beside it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope.get("method") != "POST" or not ("/gradio_api/call/" in path or path.endswith("/gradio_api/queue/join")):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}

        async def send_words(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 503:
                start.update(message)  # held until the body says whether it is the queue
                return
            if message["type"] == "http.response.body" and start:
                body = message.get("body", b"")
                m = re.search(rb"Queue is full\. Max size is (\d+)", body)
                if m and not message.get("more_body"):
                    import json

                    body = json.dumps({"detail": BUSY_WORDS.format(n=int(m.group(1)), s=BUSY_RETRY_S)}).encode()
                    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length",)]
                    headers += [(b"content-length", str(len(body)).encode()), (b"retry-after", str(BUSY_RETRY_S).encode())]
                    start["headers"] = headers
                    message = {**message, "body": body}
                held = dict(start)  # the next layer may keep this message until the body comes
                start.clear()
                await send(held)
            await send(message)

        await self.app(scope, receive, send_words)


def drop_session(app: Any, session_hash: str) -> bool:
    """Forget ``session_hash``'s state in gradio's ``StateHolder`` (no callback runs: its files stay)."""
    holder = getattr(app, "state_holder", None)
    data = getattr(holder, "session_data", None)
    if data is None or session_hash not in data:
        return False
    queue = getattr(getattr(app, "blocks", None), "_queue", None)
    if queue is not None and getattr(queue, "pending_event_ids_session", {}).get(session_hash):
        return False  # an event of it is still pending: not a finished one-shot call
    with holder.lock:
        data.pop(session_hash, None)
        holder.time_last_used.pop(session_hash, None)
    return True
