"""verl ``BaseTool``-style classes as tools: the class named in verl's tool config is imported,
built as ``Class(config=..., tool_schema=...)``, and each call runs ``create`` / ``execute`` /
``release`` as verl's ToolAgentLoop does."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from typing import Any

from backend.tools._runtime import to_content
from backend.tools.base import Tool, ToolLoadError, normalize_schema
from backend.tools.deadline import RAISED, run_coroutine
from backend.tools.outcome import CallOptions, Outcome, bad_result_outcome, exception_outcome, safe_str, timeout_outcome


def verl_schema_object(schema: dict[str, Any]) -> Any:
    """The schema as the object a verl ``BaseTool.__init__`` expects (``.function.name`` ...):
    verl's own ``OpenAIFunctionToolSchema`` when verl is installed, else an equivalent pydantic
    model that dumps back to exactly ``schema``."""
    try:  # pragma: no cover - verl is not installed in our environments
        from verl.tools.schemas import OpenAIFunctionToolSchema

        return OpenAIFunctionToolSchema.model_validate(schema)
    except Exception:  # noqa: BLE001
        pass
    from backend.tools.verl_compat import FunctionToolSchema

    return FunctionToolSchema.model_validate(schema)


async def _maybe_await(x: Any) -> Any:
    return await x if inspect.isawaitable(x) else x


class VerlTool(Tool):
    """An instance of a verl ``BaseTool``-like class.

    Each call does what verl's ToolAgentLoop does: ``create()`` an instance, ``execute(
    instance_id, arguments)`` and ``release(instance_id)`` (always, also after an error).
    ``execute`` returns ``(response, reward, metrics)``; the response's ``.text`` (or the
    response itself) becomes the content, the reward goes to ``ToolResult.reward``."""

    kind = "verl"

    def __init__(self, instance: Any, schema: Any = None, *, source: str | None = None):
        if schema is None:
            getter = getattr(instance, "get_openai_tool_schema", None)
            schema = getter() if callable(getter) else getattr(instance, "tool_schema", None)
            if schema is None:
                raise ToolLoadError(f"{source or type(instance).__name__}: the tool has no schema (get_openai_tool_schema() returned None)")
        for m in ("create", "execute"):
            if not callable(getattr(instance, m, None)):
                raise ToolLoadError(f"{source or type(instance).__name__}: a verl tool needs an async {m}() method")
        super().__init__(schema, source=source)
        self.instance = instance

    async def _invoke(self, arguments: dict[str, Any], options: CallOptions) -> Outcome:
        inst = self.instance

        async def body():
            created = await _maybe_await(inst.create())
            instance_id = created[0] if isinstance(created, tuple) else created
            try:
                return await _maybe_await(inst.execute(instance_id, arguments))
            finally:
                release = getattr(inst, "release", None)
                if callable(release):
                    await _maybe_await(release(instance_id))

        status, value = await run_coroutine(body, options.timeout_s)
        if status == "timeout":
            return timeout_outcome(self.name, options.timeout_s)
        if status == RAISED:
            return exception_outcome(self.name, value)
        response, reward, metrics = value, None, None
        if isinstance(value, tuple) and len(value) == 3:
            response, reward, metrics = value
        try:
            text, note = to_content(response)
        except Exception as e:  # noqa: BLE001
            return bad_result_outcome(self.name, e)
        out = Outcome(content=text, note=note)
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            out.reward = float(reward)
        elif reward is not None:
            out.note = ((out.note + "; ") if out.note else "") + f"non-numeric reward {safe_str(reward, 100)} ignored"
        if isinstance(metrics, dict) and metrics:
            try:
                out.metrics = json.loads(json.dumps(metrics, default=str))
            except (TypeError, ValueError, RecursionError):
                out.metrics = {str(k): safe_str(v, 200) for k, v in metrics.items()}
        return out


# ---- from verl's tool config -----------------------------------------------------------------


def import_class(class_name: Any, *, where: str, base_dir: str | None) -> type:
    """The class named by a dotted ``class_name``, imported as verl imports it (also from the
    current directory and ``base_dir``)."""
    if not isinstance(class_name, str) or "." not in class_name:
        raise ToolLoadError(f"{where}: class_name must be a dotted path like 'package.module.ClassName', got {class_name!r}")
    module_name, _, attr = class_name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as first:
        # verl resolves class_name on sys.path; also try the current directory and the config's
        # directory, as a user running the CLI from their project would expect
        extra = [p for p in dict.fromkeys([os.getcwd(), base_dir]) if p and p not in sys.path]
        sys.path[:0] = extra
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            raise ToolLoadError(f"{where}: cannot import {class_name}: {first}") from None
        except BaseException as e:  # noqa: BLE001
            raise ToolLoadError(f"{where}: importing {module_name} raised {type(e).__name__}: {safe_str(e, 500)}") from None
        finally:
            for p in extra:
                if p in sys.path:
                    sys.path.remove(p)
    except BaseException as e:  # noqa: BLE001 - a broken module
        raise ToolLoadError(f"{where}: importing {module_name} raised {type(e).__name__}: {safe_str(e, 500)}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ToolLoadError(f"{where}: module {module_name} has no attribute {attr!r}")
    if not isinstance(cls, type):
        raise ToolLoadError(f"{where}: {class_name} is not a class")
    return cls


def verl_tool_from_entry(entry: dict[str, Any], *, where: str, base_dir: str | None) -> VerlTool:
    """A tool from one entry of verl's tool config: ``{"class_name": "pkg.mod.Class", "config":
    {...}, "tool_schema": {...}}`` (the class is imported and built as verl builds it)."""
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ToolLoadError(f"{where}: config must be a mapping")
    if str(config.get("type", "native")).lower() == "mcp":
        raise ToolLoadError(f"{where}: MCP tools are not supported (they need a network server); use native tools")
    cls = import_class(entry["class_name"], where=where, base_dir=base_dir)
    schema = entry.get("tool_schema")
    schema_obj = None
    if schema is not None:
        schema = normalize_schema(schema, where=where)
        schema_obj = verl_schema_object(schema)
    try:
        instance = cls(config=config, tool_schema=schema_obj)
    except BaseException as e:  # noqa: BLE001
        raise ToolLoadError(f"{where}: creating {entry['class_name']}(config=..., tool_schema=...) raised {type(e).__name__}: {safe_str(e, 500)}") from None
    try:
        return VerlTool(instance, source=f"{where} ({entry['class_name']})")
    except ToolLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - get_openai_tool_schema() can fail
        raise ToolLoadError(f"{where}: reading the schema of {entry['class_name']} failed: {type(e).__name__}: {safe_str(e, 500)}") from None
