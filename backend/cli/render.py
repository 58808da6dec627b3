"""``render``: messages + tools through a chat template → text, token ids, tokens, spans."""

from __future__ import annotations

import json

from backend.cli import CLIError, emit, print_notes, print_warnings, read_json_file


def register(sub) -> None:
    p = sub.add_parser("render", help="render messages + tools with a chat template to text and token ids")
    p.add_argument("--tokenizer", default="qwen3", help="offline profile (python -m backend profiles), hub id or path")
    p.add_argument("--messages", required=True, help="JSON file: a list of messages (HF chat format)")
    p.add_argument("--tools", help="a .json list of tool schemas (a plain OpenAI tools list, [] for none; a \"mock\" key is "
                                   "dropped), a verl .yaml, or a .py file of documented functions. Schemas are rendered as "
                                   "given, catalogue types (dict, float, any, ...) included")
    p.add_argument("--template", help="override the chat template: a trl template name, a .jinja file, or Jinja text")
    p.add_argument("--no-generation-prompt", action="store_true", help="do not append the assistant generation prompt")
    p.add_argument("--chat-template-kwargs", default=None, help='JSON object, e.g. \'{"enable_thinking": false}\'')
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def parse_kwargs(s: str | None) -> dict:
    if not s:
        return {}
    try:
        v = json.loads(s)
    except json.JSONDecodeError as e:
        raise CLIError(f"--chat-template-kwargs is not valid JSON: {e.msg}") from None
    if not isinstance(v, dict):
        raise CLIError("--chat-template-kwargs must be a JSON object")
    return v


def load_messages(path: str) -> list[dict]:
    msgs = read_json_file(path, "messages")
    if isinstance(msgs, dict) and "messages" in msgs:
        msgs = msgs["messages"]
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        raise CLIError(f"messages file {path} must hold a JSON list of message objects")
    return msgs


def load_tool_schemas(path: str | None):
    """The tools of ``--tools`` for rendering (:func:`backend.tools.schemas_for_rendering`)."""
    from backend.tools import RenderTools, schemas_for_rendering

    if not path:
        return RenderTools([])
    return schemas_for_rendering(path)


def run(args) -> int:
    from backend.loading.tokenizers import load_tokenizer
    from backend.tokens.rendering import render

    bundle = load_tokenizer(args.tokenizer, template=args.template)
    msgs = load_messages(args.messages)
    tools = load_tool_schemas(args.tools)
    r = render(
        bundle, msgs, tools.schemas, add_generation_prompt=not args.no_generation_prompt,
        chat_template_kwargs=parse_kwargs(args.chat_template_kwargs),
    )
    out = r.to_dict(bundle.tokenizer)
    out["tokenizer"] = bundle.info().model_dump()
    if args.tools:
        out["tool_type_mappings"] = [m.to_dict() for m in tools.type_mappings]
        out["tool_notes"] = tools.notes
    print_notes(tools.notes)
    print_warnings([*bundle.template_warnings(), *r.notes])  # content parts the rendering does not show
    emit(out, args.json, None if args.json else r.text + f"\n--- {len(r.token_ids)} tokens")
    return 0
