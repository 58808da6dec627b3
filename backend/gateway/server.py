"""The gateway's HTTP routes (FastAPI, as gradio serves the app): the same routes under ``/v1`` and
under ``/s/NAME/v1`` (the session named by the route), added to a new app or to the app's own.

Every refusal is a 4xx JSON error in the dialect's shape (a bad body, a missing key, an unknown
route, a body over the limit: 413), never a traceback, and the next request is served as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from backend.errors import UserError
from backend.gateway import anthropic, chat, responses
from backend.gateway.core import Gateway, GatewayError, GatewayLimits, body_digest, session_name, strict_loads

log = logging.getLogger(__name__)

# the route of each dialect, its module (request parser, response, stream, error shape)
DIALECTS = {"chat/completions": chat, "responses": responses, "messages": anthropic}


def error_dialect(path: str) -> Any:
    """The dialect whose error shape answers an unknown route: Anthropic's under ``.../v1/messages``."""
    return anthropic if "/v1/messages" in path else chat


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayError(f"the body is {int(declared):,} bytes, over this gateway's limit of {limit:,}", 413)
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise GatewayError(f"the body is over this gateway's limit of {limit:,} bytes", 413)
        chunks.append(part)
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    try:
        body = strict_loads(raw)
    except (ValueError, RecursionError) as e:
        where = f" ({e.msg} at line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise GatewayError(f"the body is not valid JSON{where}") from None
    try:  # a lone surrogate (\\ud800) decodes, and then fails in the tokenizer: refused here, by name
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise GatewayError("the body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)") from None
    return body


def gateway_router(gateway: Gateway | Callable[[], Awaitable[Gateway]], *, key: str | None = None,
                   body_limit: int | None = None) -> APIRouter:
    """The gateway's routes. ``gateway``: the gateway, or an async function that builds it on the
    first request (the app's model loads on first use). ``key``: every request must send it
    (``Authorization: Bearer`` or ``x-api-key``); sessions are then named by the route or the
    session header only. ``body_limit``: bytes a body may hold (default: the gateway's limit)."""
    router = APIRouter()
    built: list[Gateway] = [gateway] if isinstance(gateway, Gateway) else []
    building = asyncio.Lock()
    limit = body_limit or (gateway.limits.max_body_bytes if isinstance(gateway, Gateway) else GatewayLimits.from_env().max_body_bytes)

    async def current() -> Gateway:
        if not built:
            async with building:
                if not built:
                    built.append(await gateway())  # type: ignore[operator]
        return built[0]

    def authorize(request: Request) -> str | None:
        sent = _bearer(request)
        if key is not None:
            if sent is None or not hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), key.encode("utf-8")):
                raise GatewayError("a valid API key is required (Authorization: Bearer KEY or x-api-key)", 401,
                                   "authentication_error")
            return None  # the operator's key names no session
        return sent

    async def turn(request: Request, dialect: Any, name: str | None) -> Any:
        try:
            client_key = authorize(request)
            raw = await read_body(request, limit)
            body = parse_json(raw)
            gw = await current()
            req, options = dialect.parse_request(body, gw.served_model)
            req.digest = body_digest(raw)
            session = session_name(name, client_key, request.headers.get("x-session-id"))
            result = await gw.turn(session, req)
        except GatewayError as e:
            return JSONResponse(dialect.error_body(e), status_code=e.status)
        except UserError as e:  # the model could not be loaded, a template the operator gave failed, ...
            err = GatewayError(str(e), 503, "api_error")
            return JSONResponse(dialect.error_body(err), status_code=503)
        except Exception as e:  # a bug: the client gets a JSON error, the log the traceback
            log.exception("gateway: the request failed")
            err = GatewayError(f"internal error in the gateway ({type(e).__name__}); its log has the details", 500, "api_error")
            return JSONResponse(dialect.error_body(err), status_code=500)
        headers = {"x-ali-session": result.session, "x-ali-branch": result.branch}
        if result.replayed:
            headers["x-ali-replayed"] = "true"
        if options.get("stream"):
            return StreamingResponse(dialect.stream(result, options), media_type="text/event-stream", headers=headers)
        return JSONResponse(dialect.response(result, options), headers=headers)

    async def models(request: Request) -> Any:
        # an Anthropic client (it sends anthropic-version) gets Anthropic's list; any other OpenAI's
        dialect = anthropic if request.headers.get("anthropic-version") else chat
        try:
            authorize(request)
            gw = await current()
        except GatewayError as e:
            return JSONResponse(dialect.error_body(e), status_code=e.status)
        if dialect is anthropic:
            model = {"type": "model", "id": gw.served_model, "display_name": gw.served_model,
                     "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active"}
            return {"data": [model], "has_more": False, "first_id": gw.served_model, "last_id": gw.served_model}
        return {"object": "list", "data": [{"id": gw.served_model, "object": "model", "created": 0,
                                            "owned_by": "agent-loop-inspector"}]}

    async def count_tokens(request: Request) -> Any:
        """Anthropic's ``count_tokens``: the prompt the request's messages, system and tools render
        to (with the generation prompt); no turn, no session state, no capture."""
        try:
            client_key = authorize(request)
            body = parse_json(await read_body(request, limit))
            gw = await current()
            req = anthropic.parse_count_request(body, gw.served_model)
            session_name(request.path_params.get("session"), client_key, request.headers.get("x-session-id"))  # checked only
            n = await gw.count_tokens(req)
        except GatewayError as e:
            return JSONResponse(anthropic.error_body(e), status_code=e.status)
        except UserError as e:
            return JSONResponse(anthropic.error_body(GatewayError(str(e), 503, "api_error")), status_code=503)
        except Exception as e:
            log.exception("gateway: count_tokens failed")
            err = GatewayError(f"internal error in the gateway ({type(e).__name__}); its log has the details", 500, "api_error")
            return JSONResponse(anthropic.error_body(err), status_code=500)
        return {"input_tokens": n}

    def bind(dialect: Any) -> Callable[..., Any]:
        async def handler(request: Request) -> Any:
            return await turn(request, dialect, request.path_params.get("session"))
        return handler

    for prefix in ("/v1", "/s/{session}/v1"):
        for route, dialect in DIALECTS.items():
            router.add_api_route(f"{prefix}/{route}", bind(dialect), methods=["POST"], include_in_schema=False)
        router.add_api_route(f"{prefix}/messages/count_tokens", count_tokens, methods=["POST"], include_in_schema=False)
        router.add_api_route(f"{prefix}/models", models, methods=["GET"], include_in_schema=False)

        async def unknown(request: Request, path: str = "") -> Any:
            err = GatewayError(f"no route {request.method} {request.url.path} on this gateway", 404, "not_found_error")
            return JSONResponse(error_dialect(request.url.path).error_body(err), status_code=404)

        router.add_api_route(prefix + "/{path:path}", unknown, methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
                             include_in_schema=False)
    return router


def create_app(gateway: Gateway, *, key: str | None = None) -> FastAPI:
    """A FastAPI app serving only the gateway (``python -m backend gateway``); the generators are
    closed when it shuts down."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await gateway.close()

    app = FastAPI(title="Agent Loop Inspector gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.include_router(gateway_router(gateway, key=key))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        err = GatewayError(f"no route {request.method} {request.url.path} on this gateway" if exc.status_code == 404
                           else str(exc.detail), exc.status_code, kind)
        return JSONResponse(error_dialect(request.url.path).error_body(err), status_code=exc.status_code)

    return app
