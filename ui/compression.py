"""Compressed responses for what gradio's own middleware leaves uncompressed (issue 42, item 15).

gradio 6.31 wraps its app in a Brotli middleware (gzip when the browser does not ask for ``br``) that
only compresses paths ending in a text file extension (``.js``, ``.css``, ``.json``...): the page itself
(``/``, ~540 KB of HTML) and its ``/config`` (~400 KB of JSON) have no extension and went out as they
are, ~940 KB for the first page load. :class:`Compression` gzips the responses of routes (a path whose
last segment has no ``.``) when the request accepts gzip, with Starlette's ``GZipMiddleware``, which
never compresses an event stream (``text/event-stream``: gradio's ``queue/data`` and ``call/...``
streams, the capture gateway's streamed answers), so those still arrive as they are written. Paths with
a file extension are left to gradio's middleware (never compressed twice).
"""

from __future__ import annotations

from typing import Any

from starlette.middleware.gzip import GZipMiddleware

MINIMUM_SIZE = 500  # bytes: smaller bodies are sent as they are
# zlib's default: level 9 takes ~2x the time for ~1 % fewer bytes on the page's HTML and config
COMPRESS_LEVEL = 6


class Compression:
    """ASGI middleware: gzip (Starlette's) for route responses, everything else passed through."""

    def __init__(self, app: Any, minimum_size: int = MINIMUM_SIZE, compresslevel: int = COMPRESS_LEVEL) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=compresslevel)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and "." not in scope.get("path", "").rsplit("/", 1)[-1]:
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def middleware() -> list[Any]:
    """The ``middleware`` argument of the FastAPI app gradio creates (``launch(app_kwargs=...)``)."""
    from starlette.middleware import Middleware

    return [Middleware(Compression)]
