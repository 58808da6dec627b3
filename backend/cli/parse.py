"""``parse``: model output text → content, reasoning, tool calls and errors with spans."""

from __future__ import annotations

from backend.cli import CLIError, emit


def register(sub) -> None:
    p = sub.add_parser("parse", help="parse tool calls out of model output text")
    p.add_argument("--format", default="hermes", help="parser: hermes, hunyuan, llama3_json, mistral, vllm:<name>, transformers")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text", help="the model output")
    g.add_argument("--text-file", help="a file holding the model output")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the vllm:/transformers adapters (default qwen3)")
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
    tok = None
    if args.format.startswith("vllm:") or args.format == "transformers" or args.tokenizer:
        from backend.tokenizers import load_tokenizer

        tok = load_tokenizer(args.tokenizer or "qwen3").tokenizer
    parser = get_parser(args.format, tokenizer=tok)
    res = parser.parse(text).to_dict()
    emit(res, args.json)
    return 0
