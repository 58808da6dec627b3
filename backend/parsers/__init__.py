"""Tool-call parsers, one module per format, registered by name.

>>> from backend.parsers import get_parser
>>> res = get_parser("hermes").parse('Hi <tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>')
>>> res.content, [(c.name, c.arguments) for c in res.tool_calls]
('Hi', [('f', {'x': 1})])

Native formats: ``hermes``, ``qwen3_xml``, ``harmony``, ``llama3_json``, ``mistral``, ``deepseek_v3``, ``deepseek_v31``, ``glm45``, ``minimax_m2``, ``kimi_k2``, ``pythonic``, ``granite``, ``phi4_mini_json``, ``hunyuan``. Adapters: ``transformers``
(``tokenizer.parse_response``) and ``vllm:<name>`` (vLLM's own parser, when vLLM is installed).

Each native parser declares its format (:class:`~backend.parsers.format.ToolCallFormat`);
``tool_choice``, the template sniffer (:func:`guess_parser`), the vLLM adapter and the importers
read the declarations. The parsers shipped here are listed in one table
(:data:`~backend.parsers.base.PARSER_MODULES`, name -> module) and imported on first use, so a new
format is one new module and one row of that table.
"""

from backend.parsers.base import (
    DEFAULT_FORMAT,
    PARSER_MODULES,
    ParserError,
    ParseResult,
    ToolCallParser,
    available_parsers,
    get_format,
    get_parser,
    guess_format,
    guess_parser,
    native_name,
    parser_for_vllm,
    register_parser,
    tool_call_formats,
    unregister_parser,
)
from backend.parsers.format import ToolCallFormat
from backend.parsers.vllm_adapter import vllm_available, vllm_parser_names

__all__ = [
    "DEFAULT_FORMAT",
    "PARSER_MODULES",
    "ParseResult",
    "ParserError",
    "ToolCallFormat",
    "ToolCallParser",
    "available_parsers",
    "get_format",
    "get_parser",
    "guess_format",
    "guess_parser",
    "native_name",
    "parser_for_vllm",
    "register_parser",
    "tool_call_formats",
    "unregister_parser",
    "vllm_available",
    "vllm_parser_names",
]
