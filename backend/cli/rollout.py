"""``rollout``: many agent loops concurrently (one per prompt) → traces appended as they finish."""

from __future__ import annotations

import asyncio
import os

from backend.cli import CLIError, add_model_args, apply_tool_choice, emit, engine_options, loop_config, print_notes
from backend.rollout import DEFAULT_SHARD_SIZE


def register(sub) -> None:
    p = sub.add_parser("rollout", help="run agent loops for a file of prompts, concurrently, resumable")
    p.add_argument("--prompts", required=True, help='JSONL: {"id": ..., "messages": [...]} or {"id": ..., "prompt": "text"} per line')
    p.add_argument("--tools", help="a .py file of documented functions, a .json list of tool schemas (a plain OpenAI tools list; "
                        "[] for none), or a verl .yaml. A schema's optional \"mock\" is its result; a call to a tool "
                        "without one gets a placeholder result, marked mock=default in the trace. Catalogue types "
                        "(dict, float, tuple, any, long, String, ...) are read as JSON Schema for validation and "
                        "tool_choice, and reported")
    p.add_argument("--backend", "--generator", dest="backend", default="vllm-server", help="vllm-server (default), vllm, transformers, scripted")
    p.add_argument("--server-url", action="append", default=[], help="vllm-server base URL (repeatable; see --routing)")
    p.add_argument("--model", help="vllm/transformers: hub id or local path; vllm-server: the served model name (default: discovered)")
    p.add_argument("--script", help="scripted backend: JSON list of the model's outputs, replayed for every item")
    p.add_argument("--tokenizer", default=None, help="offline profile, hub id or path (default: smollm2, or qwen3 for scripted)")
    p.add_argument("--template", help="override the chat template (trl name, .jinja file, or Jinja text)")
    p.add_argument("--concurrency", type=int, default=8, help="agent loops in flight (default 8)")
    p.add_argument("--samples", type=int, default=1, help="rollouts per prompt (ids ID#0, ID#1, ...)")
    p.add_argument("--out", required=True, help="a trace JSONL file to append to, or a FOLDER of shards (a path ending with /, an "
                        "existing folder, or with --shard-size / --format parquet): part-00000.jsonl, part-00001.jsonl, ...")
    p.add_argument("--shard-size", type=int, default=None, help=f"traces per shard (default {DEFAULT_SHARD_SIZE}); makes --out a folder")
    p.add_argument("--format", dest="out_format", choices=["jsonl", "parquet"], default="jsonl",
                   help="shard format: jsonl (default) or parquet (our trace Parquet layout; each shard is journaled as "
                        "part-NNNNN.journal.jsonl and converted atomically when full and at the end)")
    p.add_argument("--no-resume", action="store_true", help="start over: truncate --out (a folder: remove its part-* shards) "
                        "instead of skipping ids already in it")
    p.add_argument("--retry-errors", action="store_true", help="on resume, run again items whose trace ended in error/generation_error")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.config import runs_embedded_model
    from backend.loading.tokenizers import load_tokenizer
    from backend.rollout import Progress, RolloutError, RolloutStats, load_prompts, run_rollouts

    if args.concurrency < 1:
        raise CLIError("--concurrency must be at least 1")
    if args.shard_size is not None and args.shard_size < 1:
        raise CLIError("--shard-size must be at least 1")
    try:
        items = load_prompts(args.prompts, samples=args.samples)
    except RolloutError as e:
        raise CLIError(str(e)) from None
    cfg, cfg_dict = loop_config(args)
    tools = None
    if args.tools:
        if not os.path.exists(args.tools):
            raise CLIError(f"tools file not found: {args.tools}")
        from backend.tools import ToolRegistry

        tools = ToolRegistry.from_file(args.tools)
        print_notes(tools.notes())
    backend = (args.backend or "").lower()
    if backend not in ("scripted", "script"):
        from backend.generators.factory import normalize_backend

        backend = normalize_backend(backend)
    cfg = apply_tool_choice(cfg, args, config_has_choice="tool_choice" in cfg_dict, embedded_model=runs_embedded_model(backend, args.model),
                            has_tools=bool(tools and tools.names))
    generator = None
    make_generator = None
    if backend in ("scripted", "script"):
        from backend.generators.scripted import ScriptedGenerator, load_script

        if not args.script:
            raise CLIError("--backend scripted needs --script FILE")
        if not os.path.exists(args.script):
            raise CLIError(f"script file not found: {args.script}")
        script = load_script(args.script)
        bundle = load_tokenizer(args.tokenizer or "qwen3", template=args.template)

        def make_generator(item):
            return ScriptedGenerator(bundle.tokenizer, script, stop_token_ids=bundle.stop_token_ids,
                                     encode=bundle.encode_generated)
    else:
        from backend.generators.factory import create_generator, normalize_backend

        b = normalize_backend(backend)
        if b == "vllm-server" and not args.server_url:
            raise CLIError("--backend vllm-server needs at least one --server-url")
        bundle = load_tokenizer(args.tokenizer or args.model or "smollm2", template=args.template)
        generator = create_generator(b, model=args.model, server_urls=args.server_url, tokenizer=bundle, **engine_options(args, b))

    stats = RolloutStats()
    progress = Progress(stats, enabled=not args.no_progress)

    async def go():
        try:
            return await run_rollouts(
                items, bundle=bundle, out_path=args.out, generator=generator, make_generator=make_generator, tools=tools,
                config=cfg, concurrency=args.concurrency, resume=not args.no_resume, retry_errors=args.retry_errors,
                progress=progress, stats=stats, shard_size=args.shard_size, fmt=args.out_format,
            )
        finally:
            if generator is not None:
                await generator.close()

    try:
        st = asyncio.run(go())
    except RolloutError as e:
        raise CLIError(str(e)) from None
    d = st.to_dict()
    d["out"] = args.out
    d["files"] = st.files
    text = (
        f"{d['done']} item(s) written to {args.out} ({d['skipped']} already there), {d['errors']} error(s); "
        f"{d['items_per_s']} items/s, {d['tokens_per_s']} generated tok/s in {d['elapsed_s']} s; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(d["termination"].items()))
    )
    emit(d, args.json, text)
    return 0
