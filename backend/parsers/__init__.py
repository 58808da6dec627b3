"""Tool-call parsers, one module per format, registered by name.

>>> from backend.parsers import get_parser
>>> res = get_parser("hermes").parse('Hi <tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
>>> res.content, [(c.name, c.arguments) for c in res.tool_calls]
('Hi', [('f', {'x': 1})])

Native formats: ``hermes``, ``hunyuan``, ``llama3_json``, ``mistral``. Adapters: ``transformers``
(``tokenizer.parse_response``) and ``vllm:<name>`` (vLLM's own parser, when vLLM is installed).
"""

from backend.parsers.base import ParseResult, ToolCallParser, available_parsers, get_parser, register_parser

# Importing the modules registers their parsers.
from backend.parsers import hermes, hunyuan, llama3_json, mistral, transformers_adapter  # noqa: E402,F401  isort: skip
from backend.parsers.vllm_adapter import vllm_available, vllm_parser_names  # noqa: E402

__all__ = [
    "ParseResult",
    "ToolCallParser",
    "available_parsers",
    "get_parser",
    "register_parser",
    "vllm_available",
    "vllm_parser_names",
]
