"""``gateway``: serve an OpenAI-style endpoint that records every harness's turns, token-exact
(backend.gateway; docs/gateway.md)."""

from __future__ import annotations

import asyncio
import os
import sys

from backend.cli import CLIError, add_backend_args, add_model_args, engine_options, loop_config, print_warnings


def register(sub) -> None:
    p = sub.add_parser("gateway", help="serve /v1/chat/completions in front of a generator and capture every session's "
                                       "turns as traces (a tree of branches per session)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one, printed)")
    p.add_argument("--capture-dir", required=True, help="folder of capture files: one SESSION.jsonl per session, one "
                                                       "trace per branch (a live trace set: app.py --traces DIR)")
    p.add_argument("--key", default=None, help="an API key every request must send (Authorization: Bearer KEY or "
                                              "x-api-key); default: none [env ALI_GATEWAY_KEY]")
    p.add_argument("--served-model", default=None, help="the model id /v1/models lists (default: the model's name)")
    p.add_argument("--policy-version", default=None, help="a version stamped on every turn at dispatch (the weights' "
                                                         "version, for an asynchronous trainer)")
    add_backend_args(p, "scripted backend: JSON list of the model's outputs; each session replays it from the start")
    add_model_args(p)
    p.set_defaults(func=run)


def build_gateway(args, *, scripted_ok: bool = True):
    """``(Gateway, key)`` from the command's arguments (shared with app.py's --gateway)."""
    from backend.gateway.core import Gateway
    from backend.generators.factory import create_generator, normalize_backend
    from backend.generators.scripted import ScriptedGenerator, load_script
    from backend.loading.tokenizers import load_tokenizer

    cfg, _ = loop_config(args)
    b = "scripted" if args.generator == "scripted" else normalize_backend(args.generator)
    if b == "scripted":
        if not scripted_ok:
            raise CLIError("the gateway needs a model backend here")
        if not args.script:
            raise CLIError("--generator scripted needs --script FILE")
        if not os.path.exists(args.script):
            raise CLIError(f"script file not found: {args.script}")
        bundle = load_tokenizer(args.tokenizer or "qwen3", template=args.template)
        script = load_script(args.script)

        def generator_for(session: str):
            return ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                                     encode=bundle.encode_generated)
        served = args.served_model or "scripted"
    else:
        bundle = load_tokenizer(args.tokenizer or args.model or "smollm2", template=args.template)
        shared = create_generator(b, model=args.model, server_urls=args.server_url, tokenizer=bundle, **engine_options(args, b))

        def generator_for(session: str):
            return shared
        served = args.served_model or args.model or "SmolLM2-135M-Instruct"
    print_warnings(bundle.template_warnings())
    gw = Gateway(bundle, generator_for, capture_dir=args.capture_dir, max_tokens=cfg.response_length,
                 chat_template_kwargs=cfg.apply_chat_template_kwargs, parser=cfg.parser, served_model=served,
                 policy_version=args.policy_version, default_sampling=cfg.sampling,
                 max_parallel_calls=cfg.max_parallel_calls if cfg.max_parallel_calls > 1 else None)
    return gw, args.key if args.key is not None else (os.environ.get("ALI_GATEWAY_KEY") or None)


def run(args) -> int:
    import uvicorn

    from backend.gateway.server import create_app

    gw, key = build_gateway(args)
    app = create_app(gw, key=key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            print(f"gateway: serving http://{args.host}:{port}/v1 (sessions: /s/NAME/v1), capturing into "
                  f"{args.capture_dir}" + (" (API key required)" if key else ""), file=sys.stderr, flush=True)
        await task

    asyncio.run(serve())
    return 0 if server.started else 1
