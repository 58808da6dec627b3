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
import os
import sys
from typing import Any

BACKENDS = ("vllm", "vllm-server", "transformers", "scripted")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="app.py", description="Agent Loop Inspector web app")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="model backend (default: vllm when installed, else transformers); scripted replays --script")
    p.add_argument("--model", default=None, help="hub id or local path (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--server-url", action="append", default=[], help="vllm-server base URL (repeatable)")
    p.add_argument("--tokenizer", default=None, help="tokenizer: offline profile (qwen3, qwen3-thinking, qwen2.5, smollm2), hub id or path")
    p.add_argument("--template", default=None, help="chat template override: trl template name, .jinja file or Jinja text")
    p.add_argument("--script", default=None, help="scripted backend: JSON list of model outputs to preload")
    g = p.add_argument_group("engine options (vllm)")
    g.add_argument("--dtype", default=None)
    g.add_argument("--tensor-parallel-size", type=int, default=None)
    g.add_argument("--gpu-memory-utilization", type=float, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--enforce-eager", action="store_true", default=None)
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    p.add_argument("--enable-code-tools", action="store_true",
                   help="allow Python function tools in the playground (run in a sandboxed subprocess); off by default")
    p.add_argument("--concurrency-limit", type=int, default=4, help="agent runs at once, across all users")
    p.add_argument("--no-model", action="store_true", help="no model backend: explore traces (and scripted runs) only")
    p.add_argument("--sample-dir", default=None, help="folder of *.jsonl traces to load at start (default: sample_traces/)")
    return p.parse_args(argv)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
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
        from backend.generators.factory import default_backend

        backend = args.backend or default_backend()
        if backend == "vllm-server" and not args.server_url:
            raise SystemExit("--backend vllm-server needs --server-url URL")
        options = ModelOptions(backend=backend, model=args.model, server_urls=list(args.server_url), tokenizer=args.tokenizer,
                               template=args.template, engine_opts=engine_options(args))
    samples, problems = load_samples(Path(args.sample_dir) if args.sample_dir else SAMPLE_DIR)
    for p in problems:
        print(f"sample traces: {p}", file=sys.stderr)
    tok = args.tokenizer if args.tokenizer and (args.backend == "scripted" or args.no_model) else "qwen3"
    return AppContext(
        model=ModelService(options),
        enable_code_tools=args.enable_code_tools,
        concurrency_limit=args.concurrency_limit,
        default_script=script,
        default_tokenizer=tok,
        samples=samples,
        sample_problems=problems,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import ui

    ctx = build_context(args)
    ctx.warm_up()  # load the samples' tokenizers in the background: the first page view is fast
    demo = ui.build_app(ctx)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **ui.launch_kwargs())


if __name__ == "__main__":
    main()
