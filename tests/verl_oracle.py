"""verl 0.9.1's own Continuous Token builders as a test oracle (a helper module, not a test file).

``scripts/setup.sh`` installs the verl wheel with ``--no-deps --target .venv/oracles``: never into
site-packages, where its dependencies (ray, torch pins, ...) would follow. verl's package
``__init__`` imports ray, so :func:`load_verl_ct` registers empty packages ``verl``,
``verl.utils`` and ``verl.utils.tokenizer`` (each a module whose ``__path__`` is its folder under
``.venv/oracles``) and then imports ``verl.utils.tokenizer.continuous_token_wiring``, which needs
only transformers. A missing oracle is an error naming ``scripts/setup.sh``, never a skip.

:func:`verl_rollout` replays one rollout as verl 0.9.1's ``ToolAgentLoop`` builds it
(``verl/experimental/agent_loop/tool_agent_loop.py`` + ``agent_loop.py``):

* PENDING: ``prompt_ids = builder.build_initial_tokens(messages, tools=schemas)``;
* GENERATING: ``merge_assistant_tokens(prompt_ids, generated)`` then ``align_response_metadata``
  (mask 1 for the generated ids), then the parsed assistant message is appended to
  ``agent_data.messages`` (``_build_assistant_message``: ``content`` and ``tool_calls`` only);
* PROCESSING_TOOLS: ``previous_messages = list(agent_data.messages)`` (so it already holds that
  assistant message), the tool messages ``{"role": "tool", "content": text, "tool_call_id": id}``
  are appended, then ``merge_context_tokens(previous_messages, agent_data.messages, prompt_ids,
  tools=schemas)`` and ``align_response_metadata`` (mask 0 for context tokens and for the
  builder's inserted boundary tokens; metadata of removed prefix tokens is cut);
* the end: ``response_ids = prompt_ids[-len(response_mask):]`` and the rest is the prompt.

The builder renders with ``tokenizer.apply_chat_template`` itself, so it gets a copy of the
bundle's tokenizer whose ``chat_template`` is the template the bundle renders with.
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORACLE_DIR = ROOT / ".venv" / "oracles"
VERL_VERSION = "0.9.1"
WIRING = "verl.utils.tokenizer.continuous_token_wiring"

# our offline profile -> verl's Continuous Token model family (create_continuous_token_builder)
VERL_FAMILY = {
    "qwen3": "qwen3",
    "qwen3.5": "qwen35",
    "llama3": "default",
    "gpt-oss": "gptoss",
    "deepseek-v3": "deepseek",
    "glm4.5": "glm47",  # config.json model_type glm4_moe (GLM-4.5 / 4.6 / 4.7)
    "glm5": "glm5",  # glm_moe_dsa (GLM-5.x)
    "minimax-m2": "minimaxm2",  # minimax_m2
}


class VerlOracleMissing(RuntimeError):
    """The verl test oracle is not installed (or is another version)."""


def check_oracle(oracle_dir: Path) -> Path:
    """The ``verl`` package folder under ``oracle_dir``; :class:`VerlOracleMissing` naming
    ``scripts/setup.sh`` when verl 0.9.1 is not there."""
    pkg = oracle_dir / "verl"
    dist = oracle_dir / f"verl-{VERL_VERSION}.dist-info"
    if not (pkg / "utils" / "tokenizer" / "continuous_token_wiring.py").is_file() or not dist.is_dir():
        found = sorted(p.name for p in oracle_dir.glob("verl-*.dist-info")) if oracle_dir.is_dir() else []
        raise VerlOracleMissing(
            f"the verl {VERL_VERSION} test oracle is missing from {oracle_dir}"
            + (f" (found {', '.join(found)})" if found else "")
            + f": run `bash scripts/setup.sh` (it installs verl=={VERL_VERSION} there with --no-deps --target)"
        )
    return pkg


def load_verl_ct() -> types.ModuleType:
    """verl 0.9.1's ``verl.utils.tokenizer.continuous_token_wiring`` module, imported from
    ``.venv/oracles`` without verl's package ``__init__`` (which imports ray)."""
    loaded = sys.modules.get(WIRING)
    if loaded is not None:
        return loaded
    pkg = check_oracle(ORACLE_DIR)
    parent: types.ModuleType | None = None
    for name, folder in (("verl", pkg), ("verl.utils", pkg / "utils"), ("verl.utils.tokenizer", pkg / "utils" / "tokenizer")):
        mod = sys.modules.get(name)
        if mod is None:
            mod = types.ModuleType(name)
            mod.__path__ = [str(folder)]
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            mod.__spec__.submodule_search_locations = mod.__path__
            sys.modules[name] = mod
        elif [str(Path(p).resolve()) for p in getattr(mod, "__path__", [])] != [str(folder.resolve())]:
            raise VerlOracleMissing(f"a module {name!r} from {getattr(mod, '__path__', mod)} is already imported; "
                                    f"the verl oracle must come from {folder}")
        if parent is not None:
            setattr(parent, name.rsplit(".", 1)[1], mod)
        parent = mod
    return importlib.import_module(WIRING)


def verl_builder(bundle: Any, family: str, chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """verl's builder for ``family`` over a copy of ``bundle.tokenizer`` that carries the bundle's
    template. The template kwargs are the bundle's defaults updated by ``chat_template_kwargs``,
    as our engine merges them (verl takes them from ``data.apply_chat_template_kwargs``)."""
    ct = load_verl_ct()
    tok = copy.copy(bundle.tokenizer)
    tok.chat_template = bundle.chat_template
    kwargs = {**(bundle.chat_template_kwargs or {}), **(chat_template_kwargs or {})}
    return ct.create_continuous_token_builder(tok, model_family=family, chat_template_kwargs=kwargs)


def verl_assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message shaped as ``ToolAgentLoop._build_assistant_message`` makes it:
    ``content`` (``""`` for none) and, when there are calls, ``tool_calls`` of
    ``{"type": "function", "function": {"name", "arguments"}, "id"}`` with the arguments a JSON
    object (a raw string kept when it is not one, as verl keeps it). No reasoning field: verl's
    parsers do not split one off."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                decoded = json.loads(args)
            except json.JSONDecodeError:
                decoded = None
            args = decoded if isinstance(decoded, dict) else args
        call: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if c.get("id") is not None:
            call["id"] = c["id"]
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out


def verl_tool_message(message: dict[str, Any]) -> dict[str, Any]:
    """A tool message shaped as ``ToolAgentLoop._handle_processing_tools_state`` makes it (text
    only): role, content and ``tool_call_id`` when the call had one; verl sets no ``name``."""
    out: dict[str, Any] = {"role": "tool", "content": message.get("content") or ""}
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


Turn = tuple[list[int], dict[str, Any], list[dict[str, Any]] | None]


def verl_rollout(
    bundle: Any,
    family: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    turns: list[Turn],
    chat_template_kwargs: dict[str, Any] | None = None,
    *,
    record: list[Any] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Replay a rollout as verl 0.9.1's ToolAgentLoop does; returns ``(prompt_ids, response_ids,
    response_mask)`` split as verl splits them.

    ``turns``: one ``(generated_ids, assistant_message, tool_messages_or_None)`` per assistant
    turn: the ids the model generated, the message the caller parsed from them, and the tool
    messages of the calls verl would run (already cut to ``max_parallel_calls``), or ``None``
    for a turn without calls (the last one: verl stops there). Messages are reshaped the way
    verl builds them (:func:`verl_assistant_message`, :func:`verl_tool_message`). verl's budget
    checks (response_length, prompt_length, max turns) are left out: the caller's rollout is
    within them. ``record``, when given, receives each builder call's ``MergeResult`` (and the
    initial prompt ids first), for tests that look at what a merge inserted or removed.
    """
    builder = verl_builder(bundle, family, chat_template_kwargs)
    schemas = list(tools or [])  # verl passes its (possibly empty) list of schemas, never None
    agent_messages = [copy.deepcopy(m) for m in messages]
    prompt_ids = builder.build_initial_tokens(agent_messages, tools=schemas)
    if record is not None:
        record.append(list(prompt_ids))
    response_mask: list[int] = []
    for i, (generated_ids, assistant, tool_messages) in enumerate(turns):
        if i and not turns[i - 1][2]:
            raise ValueError(f"turn {i - 1} has no tool messages: verl ends the rollout there, turn {i} cannot follow")
        merge = builder.merge_assistant_tokens(prompt_ids, list(generated_ids))
        response_mask, _ = builder.align_response_metadata(merge, response_mask, None)
        prompt_ids = merge.token_ids
        if record is not None:
            record.append(merge)
        agent_messages.append(verl_assistant_message(assistant))
        if not tool_messages:
            continue  # no tool calls: verl terminates after this turn
        previous_messages = list(agent_messages)
        agent_messages.extend(verl_tool_message(m) for m in tool_messages)
        merge = builder.merge_context_tokens(previous_messages, agent_messages, prompt_ids, tools=schemas)
        response_mask, _ = builder.align_response_metadata(merge, response_mask, None)
        prompt_ids = merge.token_ids
        if record is not None:
            record.append(merge)
    # verl's split (ToolAgentLoop.run), including its slice: an empty mask would make
    # ``prompt_ids[-0:]`` the whole sequence, as it does in verl
    response_ids = prompt_ids[-len(response_mask):]
    prompt = prompt_ids[: len(prompt_ids) - len(response_mask)]
    return list(prompt), list(response_ids), list(response_mask)
