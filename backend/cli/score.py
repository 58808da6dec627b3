"""``score``: add the trainer's view of the logprobs to every trace of a file.

A teacher-forced forward pass with transformers over each trace's ids (:mod:`backend.checks.logprobs`):
each response step gets ``info.trainer_logprobs`` and the trace ``scorer``. The output is JSONL,
one trace appended (and flushed) as soon as it is scored, so an interrupted run is resumed by
running the same command again: traces whose id is already in ``--out`` are skipped. Exit
status: 0 every trace scored (or already there); 1 some records were not traces (listed); 2
nothing could be done."""

from __future__ import annotations

import os
import sys

from backend.cli import CLIError, bad_records_error, emit, print_notes

SCORERS = ("transformers", "vllm")


def register(sub) -> None:
    p = sub.add_parser(
        "score", help="add trainer-view logprobs (teacher-forced transformers forward pass) to traces; resumable",
        description="Score every trace of TRACES as a trainer would (logits / rollout temperature, log-softmax) and "
                    "append it to OUT (JSONL). Traces already in OUT are skipped, so rerunning resumes.",
    )
    p.add_argument("traces", metavar="TRACES", help="trace file (.jsonl, .json or .parquet)")
    p.add_argument("--out", required=True, help="output trace file (.jsonl); appended to, traces in it are skipped")
    p.add_argument("--scorer", choices=SCORERS, default="transformers",
                   help="transformers (any temperature) or vllm (prompt_logprobs of an in-process engine; temperature 1 only)")
    p.add_argument("--model", default=None, help="model folder or hub id (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
    p.add_argument("--temperature", type=float, default=None,
                   help="divide the logits by this (default: the rollout's recorded temperature; greedy reads as 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _done_ids(path: str) -> set[str]:
    from backend.trace import load_traces

    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return set()
    res = load_traces(path)
    return {t.id for t in res.traces}


def run(args) -> int:
    from tqdm import tqdm

    from backend.checks.logprobs import ScoreError, TransformersScorer, VLLMPromptScorer, compare, score_trace
    from backend.importers import load_any
    from backend.trace import TraceFileError, append_jsonl

    if not os.path.exists(args.traces):
        raise CLIError(f"trace file not found: {args.traces}")
    if not args.out.endswith(".jsonl"):
        raise CLIError("--out must be a .jsonl file (traces are appended one per line as they are scored)")
    if os.path.abspath(args.out) == os.path.abspath(args.traces):
        raise CLIError("--out must not be the input file")
    if args.temperature is not None and not args.temperature > 0:
        raise CLIError("--temperature must be above 0")
    try:
        res = load_any(args.traces)
    except TraceFileError as e:
        raise CLIError(str(e)) from None
    problems = [{"line": p.line, "reason": p.reason} for p in res.problems]
    if not res.traces:
        raise CLIError(f"{args.traces} holds no traces" + (f" ({len(problems)} bad record(s))" if problems else ""))
    done = _done_ids(args.out)
    todo = [t for t in res.traces if t.id not in done]
    notes = []
    if len(todo) < len(res.traces):
        notes.append(f"{len(res.traces) - len(todo)} trace(s) already in {args.out}: skipped")
    print_notes(notes)
    model = args.model
    if model is None:
        from backend.loading import models

        model = str(models.default_model_path())
    scored = []
    if todo:
        engine = None
        try:
            if args.scorer == "vllm":
                from backend.generators.vllm_engine import VLLMEngineGenerator

                engine = VLLMEngineGenerator(model, dtype=args.dtype).start_sync()
                scorer = VLLMPromptScorer(engine)
            else:
                scorer = TransformersScorer(model, args.dtype, args.device)
        except ScoreError as e:
            raise CLIError(str(e)) from None
        bar = tqdm(total=len(todo), unit="trace", desc="score", file=sys.stderr, disable=args.no_progress)
        for t in todo:
            try:
                st = score_trace(t, scorer, args.temperature)
            except ScoreError as e:
                raise CLIError(f"trace {t.id}: {e}") from None
            append_jsonl(st, args.out)
            c = compare(st).trace
            scored.append({"id": t.id, "tokens": c.tokens, "mean_abs_delta": c.mean_abs_delta, "max_abs_delta": c.max_abs_delta,
                           "rollout_probs_diff_max": c.rollout_probs_diff_max, "kl_k3": c.kl_k3})
            bar.update(1)
        bar.close()
        if engine is not None:
            engine.shutdown()
    summary = {"file": args.traces, "out": args.out, "scored": len(scored), "skipped": len(res.traces) - len(todo),
               "model": model, "dtype": args.dtype, "traces": scored, "problems": problems}
    lines = [f"scored {len(scored)} trace(s) into {args.out} ({summary['skipped']} already there); model {model}, {args.dtype}"]
    for s in scored:
        if s["tokens"]:
            lines.append(f"  {s['id']}: {s['tokens']} policy tokens with rollout logprobs, mean |Δ| {s['mean_abs_delta']:.3g}, "
                         f"max |Δ| {s['max_abs_delta']:.3g}, rollout_probs_diff_max {s['rollout_probs_diff_max']:.3g}, k3 {s['kl_k3']:.3g}")
        else:
            lines.append(f"  {s['id']}: scored (no rollout logprobs recorded to compare with)")
    emit(summary, args.json, "\n".join(lines))
    if problems:
        return bad_records_error(f"{args.traces}: {len(problems)} record(s) are not traces (first: line {problems[0]['line']}: "
                                 f"{problems[0]['reason']}); {len(scored)} trace(s) were scored")
    return 0
