"""Regenerate ``sample_traces/`` with our engine and the scripted generator (offline, deterministic).

    .venv/bin/python scripts/make_sample_traces.py [--out sample_traces] [--check]

Each scenario is a real :class:`backend.engine.AgentLoop` run: a tokenizer profile, tools with
mock results, a script of the model's outputs. Step timings are replaced by synthetic ones
(25 ms per generated token, 50 ms per tool call) so the files are byte-for-byte reproducible;
``metadata.timings`` says so. ``--check`` regenerates into memory and fails if the files differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.engine import AgentLoop, LoopConfig  # noqa: E402
from backend.generators.scripted import ScriptedGenerator  # noqa: E402
from backend.loading.tokenizers import load_tokenizer  # noqa: E402
from backend.trace import Trace  # noqa: E402

BASE_TIME = 1767225600.0  # 2026-01-01T00:00:00Z
SECONDS_PER_TOKEN = 0.025
SECONDS_PER_TOOL = 0.05


def _fn(name: str, description: str, props: dict[str, Any], required: list[str], mock: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
        "mock": mock,
    }


TEMPERATURE = _fn(
    "get_current_temperature",
    "Get current temperature at a location.",
    {"city": {"type": "string", "description": 'The location to get the temperature for, in the format "City, State, Country".'}},
    ["city"],
    {"template": {"temperature": 72, "city": "{city}"}},
)
LOCAL_TIME = _fn(
    "get_local_time",
    "Get the local time in a city.",
    {"city": {"type": "string", "description": 'The city, as "City, Country".'}},
    ["city"],
    {"template": {"city": "{city}", "local_time": "2026-01-01T09:00:00"}},
)
SEARCH_DOCS = _fn(
    "search_docs",
    "Search the project documentation and return the best matching passage.",
    {"query": {"type": "string", "description": "What to look for."}},
    ["query"],
    (
        "response_mask marks which tokens of the response the policy generated (1) and which the agent loop "
        "injected (0): tool responses, the chat template's role headers and the generation prompt that follows "
        "them. Trainers multiply the per-token loss by this mask, so injected tokens never receive gradient. "
        "When a tool response is longer than max_tool_response_length characters it is truncated before it is "
        "tokenized; the side that is kept is set by tool_response_truncate_side (left, right or middle). A "
        "truncated response still ends the tool turn normally, and the model sees only what was kept. Long "
        "responses also eat into response_length, the budget shared by generated and injected tokens."
    ),
)

WEATHER_CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>'
WEATHER_ANSWER = "The current temperature in Seattle, WA, USA is 72°F."

# Our own HunYuan-style template (written for this demo; the Qwen tokenizer's <|im_start|> turns,
# HunYuan-A13B's tool-call syntax). The tool-call parser is "hunyuan".
HUNYUAN_TEMPLATE = """\
{%- if tools or messages[0].role == 'system' %}<|im_start|>system
{%- if messages[0].role == 'system' %}
{{ messages[0].content }}
{%- endif %}
{%- if tools %}
You can call these tools (JSON schemas):
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
To call tools, answer with <tool_calls>[{"name": "...", "arguments": {...}}]</tool_calls> (one list, any number of calls).
{%- endif %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- if m.tool_calls %}<tool_calls>[
{%- for c in m.tool_calls %}{% set f = c.function if c.function is defined else c %}
{%- if not loop.first %}, {% endif %}{"name": {{ f.name | tojson }}, "arguments": {{ f.arguments if f.arguments is string else f.arguments | tojson }}}
{%- endfor %}]</tool_calls>
{%- endif %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>tool
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@dataclass
class Scenario:
    file: str
    trace_id: str
    title: str
    description: str
    tokenizer: str
    tools: list[dict[str, Any]]
    script: list[Any]
    turns: list[str]  # user messages; each after the first is a new run over the previous trace's messages
    config: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None


SCENARIOS = [
    Scenario(
        "01_weather.jsonl", "sample-weather-seattle", "weather in Seattle (seed 001)",
        "Qwen3-4B-Instruct-2507 profile, one tool call then the answer: prompt 178 tokens, mask 25×1, 29×0, 16×1 "
        "(continuous tokens: the \\n after <|im_end|> inserted at the tool boundary, as verl >= 0.9 builds it).",
        "qwen3", [TEMPERATURE], [WEATHER_CALL, WEATHER_ANSWER], ["What's the weather in Seattle?"],
    ),
    Scenario(
        "02_parallel_calls.jsonl", "sample-parallel-calls", "two tool calls in one turn",
        "Three calls in one assistant turn with max_parallel_calls=3; the three tool responses are one injected block.",
        "qwen3", [TEMPERATURE, LOCAL_TIME],
        [
            '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Tokyo, Japan"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_local_time", "arguments": {"city": "Tokyo, Japan"}}\n</tool_call>',
            "It is 72°F in Seattle and 72°F in Tokyo, where the local time is 09:00.",
        ],
        ["Compare the weather in Seattle and Tokyo, and tell me the time in Tokyo."],
        {"max_parallel_calls": 3},
    ),
    Scenario(
        "03_malformed_tool_call.jsonl", "sample-malformed-call", "a malformed tool call",
        "The model's JSON misses a closing brace: the parser reports the error with its span and the loop ends "
        "with malformed_tool_call.",
        "qwen3", [TEMPERATURE],
        ['<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle, WA, USA"}\n</tool_call>'],
        ["What's the weather in Seattle?"],
    ),
    Scenario(
        "04_truncated_tool_response.jsonl", "sample-truncated-response", "a truncated tool response",
        "The tool returns ~900 characters; max_tool_response_length=160 keeps the middle-truncated text the model sees.",
        "qwen3", [SEARCH_DOCS],
        [
            '<tool_call>\n{"name": "search_docs", "arguments": {"query": "what does response_mask mean"}}\n</tool_call>',
            "response_mask is 1 on the tokens the policy generated and 0 on the tokens the loop injected, so only "
            "generated tokens are trained on.",
        ],
        ["What does response_mask mean?"],
        {"max_tool_response_length": 160, "tool_response_truncate_side": "middle"},
    ),
    Scenario(
        "05_hunyuan_format.jsonl", "sample-hunyuan-format", "HunYuan tool-call format",
        "A custom chat template that writes <tool_calls>[...]</tool_calls> (HunYuan-A13B syntax), parsed by the "
        "'hunyuan' parser; two calls in one list.",
        "qwen3", [TEMPERATURE],
        [
            '<tool_calls>[{"name": "get_current_temperature", "arguments": {"city": "Paris, France"}}, '
            '{"name": "get_current_temperature", "arguments": {"city": "Berlin, Germany"}}]</tool_calls>',
            "Paris and Berlin are both at 72°F right now.",
        ],
        ["How warm is it in Paris and in Berlin?"],
        {"parser": "hunyuan", "max_parallel_calls": 2},
        template=HUNYUAN_TEMPLATE,
    ),
    Scenario(
        "06_thinking_multiturn.jsonl", "sample-thinking-multiturn", "multi-turn with thinking",
        "Qwen3 with <think> blocks (enable_thinking) over two user turns; the template drops the first turn's "
        "reasoning when the second turn is rendered.",
        "qwen3-thinking", [TEMPERATURE],
        [
            "<think>\nThe user wants the weather in Seattle. I should call get_current_temperature with "
            "\"Seattle, WA, USA\".\n</think>\n\n" + WEATHER_CALL,
            "<think>\nThe tool says 72 degrees.\n</think>\n\n" + WEATHER_ANSWER,
            "<think>\n72°F is (72 - 32) × 5/9 ≈ 22.2°C.\n</think>\n\nThat is about 22°C.",
        ],
        ["What's the weather in Seattle?", "And in Celsius?"],
        {"apply_chat_template_kwargs": {"enable_thinking": True}},
        system="You are a concise weather assistant.",
    ),
    Scenario(
        "07_legacy_tool_turns.jsonl", "sample-legacy-tool-turns", "the seed run as verl < 0.9 built it",
        "The weather run with tool_turns legacy (verl before 0.9, the seed's 25×1, 28×0, 16×1): the tool turn "
        "follows <|im_end|> with no \\n, a boundary the template never renders; check warns "
        "dropped_turn_separator at token 203.",
        "qwen3", [TEMPERATURE], [WEATHER_CALL, WEATHER_ANSWER], ["What's the weather in Seattle?"],
        {"tool_turns": "legacy"},
    ),
]


def normalise_timings(trace: Trace) -> Trace:
    t = BASE_TIME
    for s in trace.steps:
        if s.state == "pending":
            d = 0.004
        elif s.state == "generating":
            d = SECONDS_PER_TOKEN * (s.end - s.start)
        elif s.state == "processing_tools":
            for r in s.tool_results:
                r.duration_s = SECONDS_PER_TOOL
            d = SECONDS_PER_TOOL + 0.002
        else:
            d = 0.0
        s.started_at = round(t, 6)
        s.duration_s = round(d, 6)
        t += d
    trace.metadata["started_at"] = BASE_TIME
    trace.metadata["duration_s"] = round(t - BASE_TIME, 6)
    trace.metadata["timings"] = "synthetic (scripts/make_sample_traces.py): 25 ms per generated token, 50 ms per tool call"
    return trace


async def run_scenario(sc: Scenario) -> list[Trace]:
    """One trace per user turn (a multi-turn scenario keeps each turn's run)."""
    from backend.tools import ToolRegistry

    bundle = load_tokenizer(sc.tokenizer, template=sc.template)
    tools = ToolRegistry.from_schemas(sc.tools)
    gen = ScriptedGenerator(bundle.tokenizer, sc.script)
    cfg = LoopConfig(**sc.config)
    messages: list[dict[str, Any]] = [{"role": "system", "content": sc.system}] if sc.system else []
    trace: Trace | None = None
    traces: list[Trace] = []
    for i, user in enumerate(sc.turns):
        if trace is not None:
            messages = list(trace.messages)
        messages.append({"role": "user", "content": user})
        loop = AgentLoop(gen, bundle, tools=tools, config=cfg)
        meta = {"source": "sample", "title": sc.title, "description": sc.description, "user_turn": i + 1}
        if sc.template:
            meta["chat_template"] = sc.template
        tid = sc.trace_id if len(sc.turns) == 1 else f"{sc.trace_id}-turn{i + 1}"
        if len(sc.turns) > 1:
            meta["title"] = f"{sc.title} (user turn {i + 1})"
        # the turns of a multi-turn scenario are one conversation (metadata.conversation_id), as a Playground chat's
        trace = await loop.run(messages, trace_id=tid, metadata=meta, conversation_key=sc.trace_id if len(sc.turns) > 1 else None)
        traces.append(normalise_timings(trace))
    return traces


def render_all() -> dict[str, str]:
    out: dict[str, str] = {}
    for sc in SCENARIOS:
        traces = asyncio.run(run_scenario(sc))
        out[sc.file] = "".join(
            json.dumps(t.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n" for t in traces
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "sample_traces"))
    ap.add_argument("--check", action="store_true", help="fail if the files on disk differ from a fresh run")
    args = ap.parse_args(argv)
    files = render_all()
    out = Path(args.out)
    if args.check:
        bad = [n for n, text in files.items() if not (out / n).is_file() or (out / n).read_text(encoding="utf-8") != text]
        if bad:
            print("out of date: " + ", ".join(bad), file=sys.stderr)
            return 1
        print(f"{len(files)} sample files up to date")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
        total += len(text.encode("utf-8"))
        for line in text.splitlines():
            t = Trace.from_json(line)
            runs: list[list[int]] = []
            for m in t.response_mask:
                if runs and runs[-1][0] == m:
                    runs[-1][1] += 1
                else:
                    runs.append([m, 1])
            print(f"{name} {t.id}: {t.termination_reason}, prompt {len(t.prompt_ids)}, mask "
                  + " ".join(f"{n}×{m}" for m, n in runs))
    print(f"{len(files)} files, {total / 1024:.1f} KiB in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
