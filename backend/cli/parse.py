"""``parse``: model output text → content, reasoning, tool calls and errors with spans."""

from __future__ import annotations

from backend.cli import CLIError, emit, print_warnings


def register(sub) -> None:
    p = sub.add_parser("parse", help="parse tool calls out of model output text")
    p.add_argument("--format", default=None,
                   help="parser: a native format (hermes, qwen3_xml, harmony, llama3_json, mistral, deepseek_v3, glm45, ...; "
                        "default: the --tokenizer profile's format, else hermes), vllm:<name>, transformers")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="the model output")
    g.add_argument("--text-file", help="a file holding the model output")
    p.add_argument("--tokenizer", default=None,
                   help="offline profile, hub id or path: the vocabulary the vllm:/transformers adapters read with (default qwen3) "
                        "and the default --format")
    p.add_argument("--template", default=None, help="override the tokenizer's chat template (trl name, .jinja file, Jinja text)")
    p.add_argument("--tools", default=None, help="a .json list of tool schemas: formats that type values by schema (qwen3_xml, "
                                                 "glm45) and vLLM's parsers read them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.parsers import get_parser

    if args.text_file:
        try:
            with open(args.text_file, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            raise CLIError(f"text file not found: {args.text_file}") from None
    else:
        text = args.text
    bundle = None
    fmt = args.format
    if args.tokenizer or args.template or (fmt or "").startswith("vllm:") or fmt == "transformers":
        from backend.loading.tokenizers import load_tokenizer

        bundle = load_tokenizer(args.tokenizer or "qwen3", template=args.template)
        print_warnings(bundle.template_warnings())
    if fmt is None:
        fmt = bundle.parser if bundle is not None else "hermes"
    tools = None
    if args.tools:
        from backend.cli.render import load_tool_schemas

        tools = load_tool_schemas(args.tools).schemas
    parser = get_parser(fmt, tokenizer=bundle.tokenizer if bundle is not None else None, tools=tools)
    res = parser.parse(text).to_dict()
    emit(res, args.json)
    return 0
