"""The capture gateway on the app's own port (``app.py --gateway``): its routes (``/v1/...`` and
``/s/NAME/v1/...``, backend.gateway) added to the app gradio creates, in front of the app's own
model (or, for a scripted app, its script replayed per session).

Off on a public deployment (a Space, ``--share``, any address but loopback) unless the operator
set a key, and then every request needs it: an open endpoint there would let anyone generate on
the operator's model and write files into the capture folder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ui.context import AppContext

log = logging.getLogger(__name__)


def refusal(ctx: AppContext, key: str | None, *, public_address: bool) -> str | None:
    """Why the gateway stays off here, or None when it may serve."""
    if (ctx.trust.public or public_address) and not key:
        return ("the capture gateway is off: this app is reachable by others (public mode, a shared link or a "
                "public address) and no --gateway-key is set")
    if not ctx.model.available and not ctx.default_script:
        return "the capture gateway is off: the app has no model (--no-model) and no --script to replay"
    return None


def build_factory(ctx: AppContext, capture_dir: str):
    """An async function that builds the gateway on its first request (the app's model loads on first use)."""

    async def build() -> Any:
        from backend.gateway.core import Gateway

        if ctx.default_script and ctx.default_backend_choice == "scripted":
            from backend.generators.scripted import ScriptedGenerator

            bundle = await asyncio.to_thread(ctx.tokenizers.get, ctx.default_tokenizer)
            script = list(ctx.default_script)

            def generator_for(session: str) -> Any:
                return ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                                         encode=bundle.encode_generated)
            return Gateway(bundle, generator_for, capture_dir=capture_dir, served_model="scripted")
        generator, bundle = await ctx.model.get()
        served = ctx.model.options.model or "SmolLM2-135M-Instruct"
        return Gateway(bundle, lambda session: generator, capture_dir=capture_dir, served_model=served,
                       owns_generators=False)  # the app closes its model

    return build


def launch_kwargs(ctx: AppContext, capture_dir: str, *, key: str | None = None,
                  app_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"app_kwargs": {...}}`` for ``demo.launch``: a lifespan that puts the gateway's routes
    before gradio's own when the server starts. A ``lifespan`` already in ``app_kwargs`` runs inside it."""
    from backend.gateway.server import gateway_router

    kw = dict(app_kwargs or {})
    inner = kw.get("lifespan")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        router = gateway_router(build_factory(ctx, capture_dir), key=key)
        app.router.routes[0:0] = list(router.routes)  # before gradio's: none of them may answer for /v1
        log.info("capture gateway: /v1/chat/completions and /s/NAME/v1/... on this port, capturing into %s%s",
                 capture_dir, " (API key required)" if key else "")
        if inner is not None:
            async with inner(app) as state:
                yield state
        else:
            yield None

    kw["lifespan"] = lifespan
    return {"app_kwargs": kw}
