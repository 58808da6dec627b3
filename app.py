"""Agent Loop Inspector: the web app.

    python app.py                                  # embedded SmolLM2-135M, default backend
    python app.py --no-model                       # explore traces only
    python app.py --backend scripted --script s.json
    python app.py --backend vllm-server --server-url http://127.0.0.1:8000 --tokenizer qwen3

Command-line flags → backend objects → ``ui.build_app`` → launch. The model starts lazily on
the first playground run, so the app opens at once and browsing traces never needs a model.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from backend.errors import UserError
from backend.generators.routing import ROUTINGS

log = logging.getLogger(__name__)

BACKENDS = ("vllm", "vllm-server", "transformers", "scripted")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


class EnvDefaultError(UserError):
    """An ALI_* variable whose value the flag it sets does not accept."""


def _from_env(env: str, kind: str, fallback: Any, environ: dict[str, str]) -> Any:
    raw = environ.get(env)
    if raw is None:
        return fallback
    v = raw.strip()
    try:
        if kind == "flag":
            if v.lower() in TRUE:
                return True
            if v.lower() in FALSE:
                return fallback if fallback is not None else False
            raise ValueError("expected 1/0, true/false, yes/no")
        if kind == "int":
            return int(v)
        if kind == "float":
            return float(v)
        if kind == "list":
            return [x.strip() for x in v.split(",") if x.strip()]
        return v or fallback
    except ValueError as e:
        raise EnvDefaultError(f"environment variable {env}={raw!r}: {e}") from None


# Every flag, with the environment variable that sets it (a Hugging Face Space cannot pass
# flags): (flags, env, kind, default, help, extra argparse kwargs). The flag wins over the variable.
OPTIONS: list[tuple[tuple[str, ...], str, str, Any, str, dict[str, Any]]] = [
    (("--backend",), "ALI_BACKEND", "str", None,
     "model backend (default: picked for the hardware: vLLM on a GPU with its CUDA build, transformers on ZeroGPU, "
     "else vllm when installed, else transformers); scripted replays --script", {"choices": BACKENDS}),
    (("--model",), "ALI_MODEL", "str", None, "hub id or local path (default: the embedded SmolLM2-135M-Instruct)", {}),
    (("--server-url",), "ALI_SERVER_URL", "list", None, "vllm-server base URL (repeatable; the variable: comma-separated)",
     {"action": "append"}),
    (("--routing",), "ALI_ROUTING", "str", None,
     "vllm-server with several URLs: sticky (default: every turn of a run on one server, consistent hashing, failover "
     "to the next) or least_outstanding (each request to the least busy)", {"choices": ROUTINGS}),
    (("--tokenizer",), "ALI_TOKENIZER", "str", None,
     "tokenizer: offline profile (python -m backend profiles: qwen3, qwen3.5, llama3, gpt-oss, deepseek-v3, mistral, ...), hub id or path", {}),
    (("--template",), "ALI_TEMPLATE", "str", None, "chat template override: trl template name, .jinja file or Jinja text", {}),
    (("--script",), "ALI_SCRIPT", "str", None, "scripted backend: JSON list of model outputs to preload", {}),
    (("--dtype",), "ALI_DTYPE", "str", None, "vllm: dtype", {}),
    (("--tensor-parallel-size",), "ALI_TENSOR_PARALLEL_SIZE", "int", None, "vllm: tensor parallel size", {"type": int}),
    (("--gpu-memory-utilization",), "ALI_GPU_MEMORY_UTILIZATION", "float", None, "vllm: GPU memory share", {"type": float}),
    (("--max-model-len",), "ALI_MAX_MODEL_LEN", "int", None, "vllm: context length", {"type": int}),
    (("--enforce-eager",), "ALI_ENFORCE_EAGER", "flag", None, "vllm: no CUDA graphs", {"action": "store_true"}),
    (("--host",), "ALI_HOST", "str", None,
     "address to listen on (default 127.0.0.1; GRADIO_SERVER_NAME is read too); any address but loopback means public mode", {}),
    (("--port",), "ALI_PORT", "int", None, "port (default 7860; GRADIO_SERVER_PORT is read too)", {"type": int}),
    (("--share",), "ALI_SHARE", "flag", None, "create a public gradio.live link (public mode)", {"action": "store_true"}),
    (("--public",), "", "flag", None, "public mode whatever the address: visitors name no paths, hub ids or URLs "
     "(ALI_MODE=public)", {"action": "store_true"}),
    (("--local",), "", "flag", None, "local mode whatever the address: typed paths and hub ids are loaded; only for a "
     "server nobody else can reach (ALI_MODE=local)", {"action": "store_true"}),
    (("--enable-code-tools",), "ALI_ENABLE_CODE_TOOLS", "flag", None,
     "allow Python function tools in the playground (run in a sandboxed subprocess); off by default", {"action": "store_true"}),
    (("--concurrency-limit",), "ALI_CONCURRENCY_LIMIT", "int", 4, "agent runs at once, across all users", {"type": int}),
    (("--run-timeout-s",), "ALI_RUN_TIMEOUT_S", "float", None,
     "wall-clock limit per agent run in seconds, 0 = none (default: 300 in public mode, none in local mode)", {"type": float}),
    (("--max-upload-mb",), "ALI_MAX_UPLOAD_MB", "float", 200.0,
     "largest upload accepted; bigger ones are refused before they are stored", {"type": float}),
    (("--no-model",), "ALI_NO_MODEL", "flag", None, "no model backend: explore traces (and scripted runs) only", {"action": "store_true"}),
    (("--traces",), "ALI_TRACES", "str", None,
     "folder or glob of JSONL / Parquet trace files (a training run's rollouts): indexed (cached on disk), listed by the "
     "Trace files tab and followed while they are written", {}),
    (("--sample-dir",), "ALI_SAMPLE_DIR", "str", None, "folder of *.jsonl traces to load at start (default: sample_traces/)", {}),
    (("--mcp",), "ALI_MCP", "flag", None,
     "also serve render / parse / check as an MCP server (streamable HTTP) at /mcp on the same port", {"action": "store_true"}),
    (("--gateway",), "ALI_GATEWAY", "flag", None,
     "also serve the capture gateway (/v1/chat/completions, /s/NAME/v1/...) on the same port, in front of the app's "
     "model: any OpenAI-style harness's turns recorded token-exact (docs/gateway.md); off in public mode without "
     "--gateway-key", {"action": "store_true"}),
    (("--capture-dir",), "ALI_CAPTURE_DIR", "str", None,
     "--gateway: folder of capture files, one SESSION.jsonl per session (default: captures/ in the cache folder); "
     "followed as a trace set when --traces is not given", {}),
    (("--gateway-key",), "ALI_GATEWAY_KEY", "str", None,
     "--gateway: an API key every request must send (Authorization: Bearer KEY or x-api-key)", {}),
]
PUBLIC_RUN_TIMEOUT_S = 300.0


def parse_args(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> argparse.Namespace:
    env = os.environ if environ is None else environ
    p = argparse.ArgumentParser(
        prog="app.py", description="Agent Loop Inspector web app",
        epilog="Each flag can be set by the environment variable named beside it (the flag wins). Also: ALI_MODE="
               "public|local|auto; ALI_TEMPLATE_TIMEOUT_S, ALI_TEMPLATE_WORKERS (guarded template renders); "
               "ALI_MAX_TRACE_FILE_BYTES, ALI_MAX_TRACE_LINE_BYTES, ALI_MAX_TRACE_TOKENS, ALI_MAX_TRACE_TEXT_BYTES, "
               "ALI_MAX_FILE_VALUES, ALI_MAX_FILE_TEXT_BYTES, ALI_MAX_TRACES_PER_FILE, ALI_MAX_LISTED_PROBLEMS (trace files); "
               "ALI_TRACE_INDEX_CACHE (a folder, or off), ALI_MAX_INDEX_ROWS, ALI_MAX_INDEX_FILES (trace sets); "
               "ALI_MAX_FIELD_CHARS (visitor text fields); ALI_QUEUE_MAX_SIZE (runs waiting for a run slot, and other events "
               "waiting in gradio's queue); ALI_MAX_SESSIONS (sessions held); "
               "ALI_SHUTDOWN_TIMEOUT_S; ALI_CACHE_DIR.")
    groups = {"--dtype": p.add_argument_group("engine options (vllm)")}
    target = p
    for flags, var, kind, default, help_text, extra in OPTIONS:
        if flags[0] in groups:
            target = groups[flags[0]]
        elif flags[0] == "--host":
            target = p
        try:
            dflt = _from_env(var, kind, default, env) if var else default
        except EnvDefaultError as e:
            p.error(str(e))
        target.add_argument(*flags, default=dflt, help=help_text + (f" [env {var}]" if var else ""), **extra)
    args = p.parse_args(argv)
    if args.server_url is None:
        args.server_url = []
    if args.host is None:
        args.host = env.get("GRADIO_SERVER_NAME", "127.0.0.1")
    if args.port is None:
        args.port = int(env.get("GRADIO_SERVER_PORT", "7860"))
    if args.routing is not None and args.routing not in ROUTINGS:  # from ALI_ROUTING: argparse checks only the flag
        p.error(f"ALI_ROUTING={args.routing!r}: choose one of {', '.join(ROUTINGS)}")
    if args.public and args.local:
        p.error("--public and --local exclude each other")
    return args


def trust_policy(args: argparse.Namespace, environ: dict[str, str] | None = None, model_tokenizer: str | None = None):
    """The trust boundary for this server (backend.safety.trust): public or local mode from the flags
    and the environment, the run time limit."""
    from backend.safety.trust import Mode, TrustPolicy, decide_mode

    env = os.environ if environ is None else environ
    forced = "public" if args.public else "local" if args.local else env.get("ALI_MODE") or None
    try:
        mode, why = decide_mode(args.host, args.share, forced, env)
    except ValueError as e:
        raise SystemExit(f"ALI_MODE: {e}") from None
    timeout = args.run_timeout_s
    if timeout is None:
        timeout = PUBLIC_RUN_TIMEOUT_S if mode is Mode.PUBLIC else 0
    if timeout < 0:
        raise SystemExit("--run-timeout-s must be 0 (none) or positive")
    ops = (model_tokenizer,) if model_tokenizer else ()
    return TrustPolicy(mode, why, operator_tokenizers=ops, run_timeout_s=timeout or None)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options the operator set (flags or ``ALI_*`` variables); what is left unset is
    picked for the hardware (:func:`backend.deploy.hardware.plan`)."""
    if args.backend == "vllm-server":
        return {"routing": args.routing} if args.routing else {}
    if args.backend == "transformers":
        return {"dtype": args.dtype} if args.dtype else {}
    if args.backend not in (None, "vllm"):
        return {}
    opts = {
        "dtype": args.dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_model_len": args.max_model_len,
        "enforce_eager": args.enforce_eager,
    }
    return {k: v for k, v in opts.items() if v is not None}


def build_context(args: argparse.Namespace):
    from pathlib import Path

    from ui.context import SAMPLE_DIR, AppContext, ModelOptions, ModelService, load_samples

    if args.concurrency_limit < 1:
        raise SystemExit("--concurrency-limit must be at least 1")
    script = None
    if args.script:
        from backend.generators.scripted import ScriptError, load_script

        try:
            script = load_script(args.script)
        except (OSError, ScriptError) as e:
            raise SystemExit(f"--script: {e}") from None
    options = None
    if not args.no_model and args.backend != "scripted":
        from backend.deploy import hardware

        if args.backend == "vllm-server" and not args.server_url:
            raise SystemExit("--backend vllm-server needs --server-url URL")
        hw = hardware.detect()
        try:
            plan = hardware.plan(hw, args.backend, engine_options(args))
        except ValueError as e:  # ALI_BACKEND naming no backend (the flag's choices are checked by argparse)
            raise SystemExit(f"ALI_BACKEND: {e}") from None
        log.info("hardware: %s", hw.describe())
        for line in plan.reasons:
            log.info("hardware: %s", line)
        for line in plan.warnings:
            log.warning("hardware: WARNING: %s", line)
        options = ModelOptions(backend=plan.backend, model=args.model, server_urls=list(args.server_url), tokenizer=args.tokenizer,
                               template=args.template, engine_opts=plan.engine_opts, hardware=hw.describe(),
                               scorer_device=plan.scorer_device)
    samples, problems = load_samples(Path(args.sample_dir) if args.sample_dir else SAMPLE_DIR)
    for p in problems:
        log.warning("sample traces: %s", p)
    if args.gateway and not args.traces:  # the captures are a live trace set in the Trace files tab
        args.traces = capture_dir(args)
    tok = args.tokenizer if args.tokenizer and (args.backend == "scripted" or args.no_model) else "qwen3"
    if args.max_upload_mb <= 0:
        raise SystemExit("--max-upload-mb must be positive")
    model = ModelService(options)
    own = None
    if options is not None:
        own = options.tokenizer or options.model or "smollm2"
    elif args.tokenizer:
        own = args.tokenizer  # the operator's --tokenizer for scripted runs
    return AppContext(
        model=model,
        enable_code_tools=args.enable_code_tools,
        concurrency_limit=args.concurrency_limit,
        default_script=script,
        default_tokenizer=tok,
        samples=samples,
        sample_problems=problems,
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        trust=trust_policy(args, model_tokenizer=own),
        traces=_trace_set_spec(args.traces),
        capture_dir=capture_dir(args) if args.gateway or args.capture_dir else None,
    )


def capture_dir(args: argparse.Namespace) -> str:
    """The gateway's capture folder (made now, so that the trace set that follows it exists)."""
    from backend.runtime.cache import cache_root

    path = args.capture_dir or str(cache_root() / "captures")
    os.makedirs(path, exist_ok=True)
    return path


def _trace_set_spec(spec: str | None) -> str | None:
    """``--traces`` checked at start (a folder or glob that names nothing there is refused now,
    not at the first page view); an empty folder is fine: a run may not have written yet."""
    if not spec:
        return None
    from backend.trace import TraceFileError
    from backend.trace.catalog import resolve

    try:
        resolve(spec)
    except TraceFileError as e:
        raise SystemExit(f"--traces: {e}") from None
    return spec


def configure_logging() -> None:
    """What the app reports on itself (its mode, sample traces it cannot read, the shutdown's
    stages) is logged by its modules (``logging.getLogger(__name__)``). Here: the ``backend``
    and ``ui`` loggers and this module's at INFO, each record on stderr as its bare message (as
    these lines were printed before). Other libraries stay at WARNING, and a root handler that
    is already there (a program that embeds the app) is kept instead of ours."""
    logging.basicConfig(format="%(message)s", stream=sys.stderr)  # nothing when root has a handler
    for name in ("backend", "ui", __name__):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging()
    from backend.runtime import zerogpu

    # on ZeroGPU: `spaces` before anything touches torch / CUDA (it patches torch on import); with
    # a CPU build of torch its import would fail: checked first, said in one line, not imported
    problem = zerogpu.import_spaces()
    if problem:
        log.warning("hardware: WARNING: %s", problem)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from backend.runtime.cache import use_space_storage

    data = use_space_storage()  # before huggingface_hub is imported: it reads HF_HOME then
    if data is not None:
        log.info(f"persistent storage: caches under {data}")
    import ui

    ctx = build_context(args)
    from backend.deploy import lifecycle

    # SIGTERM / SIGINT: cancel runs, stop the server, close the model and the template worker,
    # kill what is left, remove temp files, exit (bounded: ALI_SHUTDOWN_TIMEOUT_S)
    lifecycle.install_app(ctx.model.close)
    if ctx.model.options is not None and ctx.model.options.engine_opts.get("zerogpu"):
        log.info("ZeroGPU: loading the model before the server starts")
        ctx.model.preload()
    ctx.warm_up()  # load the samples' tokenizers in the background: the first page view is fast
    if ctx.traces:  # index the trace set in the background (from the cache when the files are unchanged)
        import threading

        threading.Thread(target=ctx.trace_sets.get, args=(ctx.traces,), name="ali-trace-set", daemon=True).start()
    demo = ui.build_app(ctx)
    import gc

    # gradio leaves throwaway event loops behind; finalize them here, not later from the `spaces`
    # reloader's thread on a Space (where each logs an "Invalid file descriptor" traceback)
    gc.collect()
    lifecycle.register_server_stop(demo.close)
    t = ctx.trust
    log.info("Agent Loop Inspector: %s mode (%s); %s%s", t.mode.value, t.why,
             "visitors can name only offline profiles, trl templates and inline Jinja; "
             if t.public else "typed paths and hub ids are loaded; ",
             f"runs stop after {t.run_timeout_s:g} s" if t.run_timeout_s else "runs have no time limit")
    from backend.safety.trust import is_loopback

    if not t.public and (args.share or not is_loopback(args.host)):
        log.warning("WARNING: local mode on %s: anyone who can reach this server can make it read files and load hub ids; "
                    "use --public", "a public link" if args.share else args.host)
    kw = ui.launch_kwargs(ctx)
    if args.mcp:  # render / parse / check as an MCP server (streamable HTTP) at /mcp on this port
        from ui import mcp_server

        kw.update(mcp_server.launch_kwargs(ctx, host=args.host, app_kwargs=kw.get("app_kwargs")))
    if args.gateway:  # the capture gateway (/v1/...) on this port, in front of the app's model
        from ui import gateway

        why_not = gateway.refusal(ctx, args.gateway_key, public_address=args.share or not is_loopback(args.host))
        if why_not:
            log.warning("WARNING: %s", why_not)
        else:
            kw.update(gateway.launch_kwargs(ctx, capture_dir(args), key=args.gateway_key, app_kwargs=kw.get("app_kwargs")))
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **kw)
    lifecycle.wait_for_shutdown()  # launch() returns once the server is stopped


if __name__ == "__main__":
    main()
