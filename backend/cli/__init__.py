"""``python -m backend COMMAND``: one module per command in this package.

Each module defines ``register(subparsers)``, which adds its parser and sets
``func=handler`` where ``handler(args) -> int``. User errors are raised as :class:`CLIError`
(or any project error derived from ValueError/OSError) and printed as one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import sys
from typing import Any

from backend.errors import UserError
from backend.generators.routing import ROUTINGS


class CLIError(UserError):
    """An error the user can fix; printed as one line, exit status 2."""


# Exit statuses of the commands that read record files (import, export, check): 0 every record
# was read; 1 some records were bad (listed; the good ones were written / checked); 2 nothing
# could be done (usage, a missing or unreadable file, an empty input, no readable record).
EXIT_SOME_BAD = 1


def bad_records_error(message: str) -> int:
    """Print one ``error:`` line for bad records on stderr (the summary on stdout lists them)
    and return the exit status :data:`EXIT_SOME_BAD`."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_SOME_BAD


def emit(obj: Any, as_json: bool, text: str | None = None) -> None:
    """Print a result: JSON with --json, else the human text (or pretty JSON)."""
    if as_json or text is None:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=None if as_json else 2) + "\n")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows of cells as aligned, indented lines (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def print_notes(notes: list[str]) -> None:
    """What the user should know but is not an error, one ``note:`` line each on stderr (stdout
    stays the result, parseable with --json)."""
    for n in notes:
        print(f"note: {n}", file=sys.stderr)


def print_warnings(warnings: list[str]) -> None:
    """What is probably wrong but does not stop the command (a template that does not fit the
    tokenizer), one ``warning:`` line each on stderr."""
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)


def read_json_file(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CLIError(f"{what} file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise CLIError(f"{what} file {path} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError:
        raise CLIError(f"{what} file {path} is not UTF-8 text") from None


def add_loop_args(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and one flag per LoopConfig field (:data:`backend.config.FIELDS`); a flag
    wins over the file, the file over the field's ``ALI_*`` variable."""
    from backend.config import FIELDS

    p.add_argument("--config", help="JSON file of LoopConfig fields (response_length, max_parallel_calls, sampling, ...)")
    g = p.add_argument_group("loop settings (LoopConfig; each flag overrides --config)")
    for name, k in FIELDS.items():
        extra = {"choices": k.choices} if k.kind == "choice" else {}
        metavar = {"int": "N", "float": "X", "object": "JSON", "choice": None}.get(k.kind, k.kind.upper())
        g.add_argument(k.flag(name), dest=name, default=None, metavar=metavar,
                       help=k.help + (f" [env {k.env}]" if k.env else ""), **extra)


def loop_config(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """``(LoopConfig, the settings given)`` from the field's ``ALI_*`` variables, ``--config`` and
    the per-field flags (in that order, the last wins)."""
    from backend.config import FIELDS, ConfigError, LoopConfig, env_defaults

    given = env_defaults()
    if getattr(args, "config", None):
        d = read_json_file(args.config, "config")
        if not isinstance(d, dict):
            raise CLIError("--config must hold a JSON object of LoopConfig fields")
        given.update(d)
    for name, k in FIELDS.items():
        v = getattr(args, name, None)
        if v is None:
            continue
        try:
            given[name] = k.parse(v)
        except ConfigError as e:
            raise CLIError(f"{k.flag(name)}: {e}") from None
    return LoopConfig.from_dict(given), given


def add_backend_args(p: argparse.ArgumentParser, script_help: str) -> None:
    """The options that choose what runs a model (``run``, ``gateway``): the tokenizer and template,
    the backend, its script, model and servers."""
    p.add_argument("--tokenizer", default=None,
                   help="offline profile, hub id or path (default: qwen3 for scripted, the model's own otherwise)")
    p.add_argument("--template", help="override the chat template (trl name, .jinja file, or Jinja text)")
    p.add_argument("--generator", "--backend", dest="generator", default="scripted",
                   help="scripted, vllm, vllm-server, transformers")
    p.add_argument("--script", help=script_help)
    p.add_argument("--model", help="vllm/transformers: hub id or local path (default: the embedded SmolLM2-135M)")
    p.add_argument("--server-url", action="append", default=[], help="vllm-server base URL (repeatable; see --routing)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The options shared by commands that run a model: the loop settings and the vLLM engine options."""
    add_loop_args(p)
    g = p.add_argument_group("vLLM engine options (--backend vllm)")
    g.add_argument("--dtype", default=None, help="auto, float32, bfloat16, float16 (default: auto; float32 on CPUs without bf16)")
    g.add_argument("--tensor-parallel-size", type=int, default=None)
    g.add_argument("--gpu-memory-utilization", type=float, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--enforce-eager", action="store_true", default=None)
    s = p.add_argument_group("vLLM server options (--backend vllm-server)")
    s.add_argument("--routing", choices=ROUTINGS, default=None,
                   help="with several --server-url: sticky (default) sends every turn of a conversation to one server, "
                        "chosen by consistent hashing, and moves it to the next server on the ring when that one fails; "
                        "least_outstanding sends each request to the server with the fewest in flight")


def engine_options(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The backend options given on the command line: the vLLM engine options (in-process vLLM
    backend), the routing policy (vllm-server)."""
    if backend == "vllm-server":
        routing = getattr(args, "routing", None)
        return {"routing": routing} if routing else {}
    if backend != "vllm":
        return {}
    opts = {k: getattr(args, k, None) for k in ("dtype", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enforce_eager")}
    return {k: v for k, v in opts.items() if v is not None}


def apply_tool_choice(cfg: Any, args: argparse.Namespace, *, config_has_choice: bool, embedded_model: bool, has_tools: bool) -> Any:
    """``cfg`` (a LoopConfig) with the tool_choice from ``--tool-choice``, or the default policy
    (:func:`backend.tool_choice.default_policy`) when neither the flag nor the config set one."""
    import dataclasses

    from backend.config import ConfigError
    from backend.tool_choice import default_policy

    if args.tool_choice is not None:
        choice: Any = args.tool_choice
    elif config_has_choice:
        return cfg
    else:
        choice = list(default_policy(embedded_model=embedded_model, has_tools=has_tools))
    try:
        return dataclasses.replace(cfg, tool_choice=choice)
    except ConfigError as e:
        raise CLIError(f"--tool-choice: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend", description="Agent Loop Inspector: token-exact agent loops, traces and diagnostics.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    # stdout is for results (--json must parse): vLLM logs to stdout by default
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # project errors (TokenizerLoadError, RenderError, ...) and I/O
        print(f"error: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except Exception as e:  # a bug: still one line, with a pointer to the full traceback
        if debug:
            raise
        print(f"error: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); rerun with --debug for the traceback", file=sys.stderr)
        return 1
