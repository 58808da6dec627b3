"""``run``: one agent loop → a trace file."""

from __future__ import annotations

import asyncio
import os

from backend.cli import (
    CLIError,
    add_backend_args,
    add_model_args,
    apply_tool_choice,
    emit,
    engine_options,
    loop_config,
    print_notes,
    print_warnings,
)
from backend.cli.render import load_messages


def register(sub) -> None:
    p = sub.add_parser("run", help="run one agent loop and write its trace")
    add_backend_args(p, "scripted backend: JSON list of the model's outputs, one per turn")
    p.add_argument("--tools", help="a .py file of documented functions, a .json list of tool schemas (a plain OpenAI tools list; "
                        "[] for none), or a verl .yaml. A schema's optional \"mock\" is its result; a call to a tool "
                        "without one gets a placeholder result, marked mock=default in the trace. Catalogue types "
                        "(dict, float, tuple, any, long, String, ...) are read as JSON Schema for validation and "
                        "tool_choice, and reported")
    p.add_argument("--messages", required=True, help="JSON file: the conversation so far (HF chat format)")
    p.add_argument("--out", required=True, help="trace file to write (JSON lines; one trace)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    add_model_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.config import runs_embedded_model
    from backend.engine import AgentLoop
    from backend.generators.scripted import ScriptedGenerator, load_script
    from backend.loading.tokenizers import load_tokenizer
    from backend.trace import write_jsonl
    from backend.trace.builder import mask_runs

    cfg, cfg_dict = loop_config(args)
    msgs = load_messages(args.messages)
    tools = None
    if args.tools:
        from backend.tools import ToolRegistry

        tools = ToolRegistry.from_file(args.tools)
        print_notes(tools.notes())

    from backend.generators.factory import create_generator, normalize_backend

    b = "scripted" if args.generator == "scripted" else normalize_backend(args.generator)
    cfg = apply_tool_choice(cfg, args, config_has_choice="tool_choice" in cfg_dict, embedded_model=runs_embedded_model(b, args.model),
                            has_tools=bool(tools and tools.names))
    if b == "scripted":
        if not args.script:
            raise CLIError("--generator scripted needs --script FILE")
        if not os.path.exists(args.script):
            raise CLIError(f"script file not found: {args.script}")
        bundle = load_tokenizer(args.tokenizer or "qwen3", template=args.template)
        gen = ScriptedGenerator(bundle.tokenizer, load_script(args.script), stop_token_ids=bundle.stop_token_ids,
                                encode=bundle.encode_generated)
    else:
        bundle = load_tokenizer(args.tokenizer or args.model or "smollm2", template=args.template)
        gen = create_generator(b, model=args.model, server_urls=args.server_url, tokenizer=bundle, **engine_options(args, b))

    print_warnings(bundle.template_warnings())

    async def go():
        try:
            return await AgentLoop(gen, bundle, tools=tools, config=cfg).run(msgs)
        finally:
            await gen.close()

    trace = asyncio.run(go())
    write_jsonl([trace], args.out)
    runs = [list(r) for r in mask_runs(trace.response_mask)]
    summary = {
        "out": args.out,
        "id": trace.id,
        "termination_reason": trace.termination_reason,
        "prompt_tokens": len(trace.prompt_ids),
        "response_tokens": len(trace.response_ids),
        "mask_runs": runs,
        "steps": [s.state for s in trace.steps],
        "errors": trace.step_errors(),
        "placeholder_results": sum(1 for s in trace.steps for r in s.tool_results if getattr(r, "mock", None) == "default"),
        "tool_type_mappings": trace.metadata.get("tool_type_mappings", []),
    }
    text = (
        f"wrote {args.out}: {summary['termination_reason']}, prompt {summary['prompt_tokens']} tokens, "
        f"response {summary['response_tokens']} tokens, mask " + " ".join(f"{n}×{m}" for m, n in runs)
    )
    if summary["placeholder_results"]:
        text += f"; {summary['placeholder_results']} tool call(s) got a placeholder result (no \"mock\" in the tool's schema)"
    emit(summary, args.json, text)
    return 0
