"""Other tools' files in a trace set: a light summary row per conversation when a set is indexed
(no tokenizer, no rendering), and the trace of one row when it is opened. The catalogue
(:mod:`backend.trace.catalog`) does not import the importers: it reads these rows through
:class:`ImporterRows`, its :class:`~backend.trace.catalog.ForeignRows`, which :mod:`backend.importers`
registers when imported (:func:`register`).

* **Per-record formats** (Anthropic, LangChain, TRL rows ...): the record is converted to its
  conversation(s) (cheap: no rendering) and summarised; token columns stay unknown (null) until a
  row is opened and rendered. A record giving several conversations gives several rows.
* **Span files** (OTLP JSON lines, SDK span JSON lines): one row per trace id, summarised from
  the spans alone (no attribute JSON is parsed: chat spans are counted by their operation / kind
  attributes); the row's location covers the lines from the trace's first span to its last, and
  opening it reads those lines and keeps only that trace's spans.
* **verl rollout dumps** (``input``/``output`` text rows, agent-loop ``prompt_ids``/``response_ids``
  rows): summarised from the row without converting it (:func:`verl_summary`), converted by the
  verl importer when opened.
* **prime-rl token exports and verifiers episodes** (a run folder's ``token_exports/step_N/rank_R.jsonl``
  and ``rollouts/step_N/.../traces.jsonl``): summarised from the row without a tokenizer
  (:func:`prime_rl_summary`, :func:`verifiers_summaries`: ids counted, score, step and rank from
  the record or the path, group, end state), converted by their importers when opened. A row the
  light summary is not sure of (no id it can name, lengths that disagree ...) is converted in full
  as any other record, so its problem is the importer's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.importers import ImportContext, convert_group, convert_record, detect_record, get_importer
from backend.importers.common import Conversation, RecordError, record_id
from backend.importers.otlp import hex_id, looks_like_otel
from backend.importers.rollout_fields import is_int, run_path_fields
from backend.importers.verifiers import branch_paths, termination_of, traces_of
from backend.trace.catalog import register_foreign_rows
from backend.trace.index import group_id_of, preview_text, summary_of_trace, training_step_of
from backend.trace.limits import LoadProblem, too_many_tokens
from backend.trace.model import Trace

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

_CHAT_OPS = ("chat", "text_completion", "generate_content")


def _loads(raw: bytes) -> Any:
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    return _orjson.loads(raw) if _orjson is not None else json.loads(raw)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def summary_of_conversation(conv: Conversation, name: str, fallback_id: str) -> dict[str, Any]:
    msgs = conv.messages
    meta = conv.metadata
    first_user = next((m.get("content") for m in msgs if m.get("role") == "user"), "")
    score = meta.get("score", meta.get("reward_score"))
    return {
        "id": str(conv.id or fallback_id), "source": name, "turns": sum(1 for m in msgs if m.get("role") == "assistant"),
        "tokens": None, "prompt_tokens": None, "response_tokens": None,
        "termination_reason": str(conv.termination_reason or ""), "errors": sum(len(v) for v in conv.parse_errors.values()),
        "messages": len(msgs), "tools": len(conv.tools), "duration_s": _number(meta.get("duration_s")),
        "score": _number(score), "preview": preview_text(first_user if isinstance(first_user, str) else ""),
        "training_step": training_step_of(meta), "tool_errors": 0, "parse_errors": sum(len(v) for v in conv.parse_errors.values()),
    }


def _summary_of_trace(t: Trace, name: str) -> dict[str, Any]:
    s = summary_of_trace(t)
    s["source"] = name
    return s


class _NoTokenizer(ImportContext):
    """An import context for indexing: a format that needs the tokenizer to give its
    conversation (token ids to decode) is summarised when opened instead."""

    @property
    def bundle(self):  # type: ignore[override]
        raise _NeedsTokenizer()


class _NeedsTokenizer(Exception):
    pass


def _one_record(ctx: ImportContext, path: str | None = None) -> ImportContext:
    """The set's context for one record of the file ``path``: the same tokenizer and parser, none
    of an import's per-file state (the counter that tells identical rows of one import apart), so
    a row gets the same id when indexed and when opened, whichever rows were read before it; and
    its own file's path (a run folder's ``step_<N>/rank_<R>.jsonl`` names the record's step and
    rank), not the path of the file the set's context was first made for."""
    c = copy.copy(ctx)
    c.__dict__.pop("_content_ids", None)
    if path is not None:
        c.path = path
    return c


def summaries_of_record(rec: Any, n: int, path: str, ctx: ImportContext | None = None) -> list[dict[str, Any]] | LoadProblem | None:
    """The rows of one record of another tool's per-record format, a problem, or None when the
    record is of no known format (or a span record: see :class:`SpanGroups`). ``ctx``: the set's
    import context (its tokenizer reads tool calls out of completion text: TRL, SkyRL, ShareGPT);
    without one such records get a row with what the record itself says."""
    name = detect_record(rec)
    if name is None or name == "trace" or get_importer(name).grouped:
        return None
    try:
        items = get_importer(name).convert(rec, _one_record(ctx, path) if ctx is not None else _NoTokenizer(path=path))
    except RecordError as e:
        return LoadProblem(n, str(e))
    except _NeedsTokenizer:
        return [{**_unknown_row(rec, name, n, path)}]
    except Exception as e:  # noqa: BLE001 - one bad record must not stop the set
        return LoadProblem(n, f"internal error: {type(e).__name__}: {e}"[:500])
    out = []
    for k, item in enumerate(items):
        fallback = f"{record_id(rec)}-{k}" if len(items) > 1 else record_id(rec)
        if isinstance(item, Conversation):
            out.append(summary_of_conversation(item, name, fallback))
        elif isinstance(item, Trace):
            out.append(_summary_of_trace(item, name))
    return out


def _unknown_row(rec: Any, name: str, n: int, path: str) -> dict[str, Any]:
    return {"id": record_id(rec), "source": name, "turns": None, "tokens": None, "prompt_tokens": None, "response_tokens": None,
            "termination_reason": "", "errors": 0, "messages": 0, "tools": 0, "duration_s": None, "score": None, "preview": "",
            "training_step": training_step_of(rec if isinstance(rec, dict) else {}), "tool_errors": 0, "parse_errors": 0}


# ---- span files -----------------------------------------------------------------------------------


@dataclass
class _TraceAcc:
    line: int
    offset: int
    end: int
    spans: int = 0
    chat: int = 0
    tools: int = 0
    errors: int = 0
    start_ns: int | None = None
    end_ns: int | None = None


def _ns(v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return None


_WANTED = frozenset(("gen_ai.operation.name", "openinference.span.kind", "langfuse.observation.type", "gen_ai.prompt.0.role"))


def _wanted(attrs: Any) -> dict[str, Any]:
    """The few attributes a span's row needs (OTLP key/value list or SDK dict)."""
    if isinstance(attrs, list):
        try:
            d = {kv["key"]: kv["value"] for kv in attrs}
        except (TypeError, KeyError):
            return {}
        out = {}
        for k in _WANTED & d.keys():
            v = d[k]
            out[k] = next(iter(v.values()), None) if isinstance(v, dict) and v else v
        return out
    if isinstance(attrs, dict):
        return {k: attrs[k] for k in _WANTED & attrs.keys()}
    return {}


@dataclass
class SpanGroups:
    """Span lines of one file, accumulated by trace id while a set indexes the file."""

    traces: dict[str, _TraceAcc] = field(default_factory=dict)

    def add(self, d: dict[str, Any], n: int, offset: int, length: int) -> LoadProblem | None:
        try:
            for tid, span in _spans_light(d):
                acc = self.traces.get(tid)
                if acc is None:
                    acc = self.traces[tid] = _TraceAcc(n, offset, offset + length)
                acc.end = offset + length
                acc.spans += 1
                a = _wanted(span.get("attributes"))
                op = a.get("gen_ai.operation.name")
                kind = a.get("openinference.span.kind") or a.get("langfuse.observation.type")
                if op in _CHAT_OPS or kind in ("LLM", "generation") or "gen_ai.prompt.0.role" in a:
                    acc.chat += 1
                elif op == "execute_tool" or kind in ("TOOL", "tool"):
                    acc.tools += 1
                st = span.get("status")
                code = st.get("code", st.get("status_code")) if isinstance(st, dict) else None
                if code in (2, "STATUS_CODE_ERROR", "ERROR", "StatusCode.ERROR"):
                    acc.errors += 1
                s0 = _ns(span.get("startTimeUnixNano", span.get("start_time_unix_nano")))
                s1 = _ns(span.get("endTimeUnixNano", span.get("end_time_unix_nano")))
                if s0 is not None:
                    acc.start_ns = s0 if acc.start_ns is None else min(acc.start_ns, s0)
                if s1 is not None:
                    acc.end_ns = s1 if acc.end_ns is None else max(acc.end_ns, s1)
        except RecordError as e:
            return LoadProblem(n, str(e))
        return None

    def rows(self) -> list[tuple[dict[str, Any], int, int, int]]:
        """``(summary, line, offset, length)`` per trace, in the order of their first spans."""
        out = []
        for tid, a in self.traces.items():
            dur = (a.end_ns - a.start_ns) / 1e9 if a.start_ns is not None and a.end_ns is not None and a.end_ns >= a.start_ns else None
            out.append(({
                "id": tid, "source": "otel", "turns": a.chat, "tokens": None, "prompt_tokens": None, "response_tokens": None,
                "termination_reason": "", "errors": a.errors, "messages": 0, "tools": 0, "duration_s": dur, "score": None,
                "preview": f"{a.spans} span(s), {a.chat} model call(s), {a.tools} tool call(s)", "training_step": None,
                "tool_errors": 0, "parse_errors": 0,
            }, a.line, a.offset, a.end - a.offset))
        return out


_TIDS: dict[Any, str | None] = {}


def _tid(v: Any) -> str | None:
    """:func:`hex_id` of a trace id, remembered (a trace's spans repeat it; bounded)."""
    h = _TIDS.get(v, _TIDS) if isinstance(v, str) else _TIDS
    if h is _TIDS:
        h = hex_id(v, 16, "traceId")
        if len(_TIDS) > 65_536:
            _TIDS.clear()
        if isinstance(v, str):
            _TIDS[v] = h
    return h  # type: ignore[return-value]


def _spans_light(d: dict[str, Any]) -> Any:
    """``(trace id hex, span dict)`` of a span record, without unwrapping attributes."""
    rs = d.get("resourceSpans", d.get("resource_spans"))
    if isinstance(rs, list):
        for r in rs:
            for ss in (r.get("scopeSpans", r.get("scope_spans")) or []) if isinstance(r, dict) else []:
                for s in (ss.get("spans") or []) if isinstance(ss, dict) else []:
                    if isinstance(s, dict):
                        tid = _tid(s.get("traceId", s.get("trace_id")))
                        if tid:
                            yield tid, s
        return
    rl = d.get("resourceLogs", d.get("resource_logs"))
    if isinstance(rl, list):
        for r in rl:
            for sl in (r.get("scopeLogs", r.get("scope_logs")) or []) if isinstance(r, dict) else []:
                for lr in (sl.get("logRecords", sl.get("log_records")) or []) if isinstance(sl, dict) else []:
                    if isinstance(lr, dict):
                        tid = hex_id(lr.get("traceId", lr.get("trace_id")), 16, "traceId")
                        if tid:
                            yield tid, {}
        return
    ctx = d.get("context")
    if isinstance(ctx, dict):
        tid = hex_id(ctx.get("trace_id"), 16, "context.trace_id")
        if tid:
            yield tid, d
        return
    tid = hex_id(d.get("traceId"), 16, "traceId")
    if tid:
        yield tid, d


def is_span_record(d: Any) -> bool:
    return looks_like_otel(d) is not None


# ---- opening a row ----------------------------------------------------------------------------------


def open_record_row(rec: Any, n: int, row_id: str, ctx: ImportContext, where: dict[str, Any], path: str | None = None) -> Trace | LoadProblem:
    """The trace of a per-record row (the conversation whose id is ``row_id``) of the file ``path``."""
    got: list[Trace | LoadProblem] = [item for item, _ in convert_record(n, rec, "auto", _one_record(ctx, path), where)]
    for item in got:
        if isinstance(item, Trace) and item.id == row_id:
            return item
    traces = [x for x in got if isinstance(x, Trace)]
    if len(traces) == 1:
        return traces[0]
    problems = [x for x in got if isinstance(x, LoadProblem)]
    return problems[0] if problems else LoadProblem(n, f"no conversation with id {row_id!r} in this record")


def open_span_row(raw: bytes, first_line: int, trace_id: str, ctx: ImportContext, where: dict[str, Any]) -> Trace | LoadProblem:
    """The trace ``trace_id`` out of the lines ``raw`` (from its first span's line to its last)."""
    records = []
    for k, line in enumerate(raw.splitlines()):
        if not line.strip():
            continue
        try:
            d = _loads(line)
        except ValueError:
            continue  # reported when the set was indexed
        if is_span_record(d) and any(tid == trace_id for tid, _ in _spans_light(d)):
            records.append((first_line + k, d))
    mine: list[Trace] = []
    for _, item in convert_group("otel", records, ctx, where, "line"):
        if isinstance(item, Trace) and (item.id == trace_id or item.id.startswith(trace_id + "-")):
            mine.append(item)
        elif isinstance(item, LoadProblem) and trace_id in item.reason:
            return item
    if not mine:
        return LoadProblem(first_line, f"trace {trace_id} is no longer in the file")
    t = mine[0]
    if len(mine) > 1:  # one row per trace id: say what else the trace holds
        t.metadata.setdefault("import", {})["other_conversations"] = [x.id for x in mine[1:]]
    return t


# ---- verl rollout dumps -------------------------------------------------------------------------------


def verl_record(raw: bytes) -> dict[str, Any] | None:
    """The record of a line that is not our trace but a verl output (the verl importer's sniff)."""
    try:
        d = json.loads(raw.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):
        return None
    return d if get_importer("verl").sniff(d) else None


def verl_id(d: dict[str, Any], path: str, line: int) -> str:
    """A verl row's id: its ``uid`` (or id / request_id), else stable from the file and line."""
    uid = d.get("uid", d.get("id", d.get("request_id")))
    if isinstance(uid, str | int) and not isinstance(uid, bool) and str(uid) != "":
        return str(uid)
    return f"verl-{hashlib.sha256(f'{os.path.abspath(path)}:{line}'.encode()).hexdigest()[:12]}"


def verl_summary(raw: bytes, path: str, line: int) -> dict[str, Any] | None:
    """A light summary of a verl rollout-dump row (``input``/``output`` text, ``score``, ``step``)
    or agent-loop output (``prompt_ids``/``response_ids``), without a tokenizer: token counts are
    unknown (null) for text rows, counted for id rows; turns and termination are not known."""
    d = verl_record(raw)
    return None if d is None else _verl_summary_of(d, path, line)


def _verl_summary_of(d: dict[str, Any], path: str, line: int) -> dict[str, Any] | None:
    ids = isinstance(d.get("prompt_ids"), list) and isinstance(d.get("response_ids"), list)
    p, r = (len(d["prompt_ids"]), len(d["response_ids"])) if ids else (None, None)
    if p is not None and too_many_tokens(p + r):
        return None  # refused as the importer refuses it
    uid = verl_id(d, path, line)
    step = d.get("step", d.get("global_step"))
    score = d.get("score")
    inp = d.get("input")
    tr = d.get("termination_reason")
    return {
        "id": str(uid), "source": "verl", "turns": None, "tokens": None if p is None else p + r,
        "prompt_tokens": p, "response_tokens": r, "termination_reason": tr if isinstance(tr, str) else "",
        "errors": 0, "messages": 0, "tools": 0, "duration_s": None,
        "score": float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None,
        "preview": preview_text(inp) if isinstance(inp, str) else "",
        "training_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        "tool_errors": 0, "parse_errors": 0, "group": group_id_of({"uid": d.get("uid")}),
    }


def open_verl_row(rec: dict[str, Any], n: int, path: str, ctx: ImportContext) -> Trace | LoadProblem:
    """A verl row converted by the verl importer with the set's tokenizer."""
    for item, _ in convert_record(n, rec, "verl", ctx, where={"file": os.path.basename(path), "line": n}):
        if isinstance(item, Trace):
            item.id = verl_id(rec, path, n)  # the id the index lists it by
        return item
    return LoadProblem(n, "the verl row gave no trace")


# ---- prime-rl token exports and verifiers episodes ---------------------------------------------------


def _row(rid: str, source: str, p: int, n: int, step: Any, score: float | None = None, **kw: Any) -> dict[str, Any]:
    return {"id": rid, "source": source, "turns": kw.get("turns"), "tokens": n, "prompt_tokens": p, "response_tokens": n - p,
            "termination_reason": kw.get("termination_reason") or "", "errors": 0, "messages": kw.get("messages", 0),
            "tools": kw.get("tools", 0), "duration_s": None, "score": score, "preview": kw.get("preview", ""),
            "training_step": step if is_int(step) else None, "tool_errors": 0, "parse_errors": 0,
            "group": kw.get("group"), "rank": kw.get("rank")}


def prime_rl_summary(d: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The row of a prime-rl token export without a tokenizer: its ids counted (the prompt is
    what comes before the first loss-mask token, as the importer splits it), step and rank from
    the record, else from ``step_<N>/rank_<R>.jsonl``; turns and messages unknown (the importer
    decodes them). ``rank`` is an index column (``group`` too, None: the export names none). None when
    the record is not one the summary is sure of (then it is converted in full, for its reason)."""
    ids, mask = d.get("token_ids"), d.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask) or too_many_tokens(len(ids)):
        return None
    p = next((k for k, m in enumerate(mask) if m is True), None)
    if p is None:
        return None
    pf = run_path_fields(path)
    step = d["step"] if is_int(d.get("step")) else pf.get("training_step")
    rank = d["rank"] if is_int(d.get("rank")) else pf.get("rank")
    seq = d.get("export_sequence_idx")
    if not (is_int(seq) and is_int(step) and is_int(rank)):
        return None  # the importer's id is then a hash of the whole record
    return _row(f"prime-rl-s{step}-r{rank}-{seq}", "prime-rl", p, len(ids), step, rank=rank)


def verifiers_summaries(d: dict[str, Any], path: str) -> list[dict[str, Any]] | None:
    """The rows of a verifiers episode (or trace) without a tokenizer, one per branch as the
    importer makes them: ids counted along the branch, ``score`` (the rewards' score × weight
    summed), step (``run.work.step``, else the path), ``group``, the end state, messages, turns
    (sampled nodes) and the first user message as preview. None when the summary is not sure (a
    branch without ids is rendered; nodes of the wrong shape; no trace id): converted in full."""
    episode, traces = traces_of(d)
    run = (episode or {}).get("run")
    work = run.get("work") if isinstance(run, dict) else None
    step = work["step"] if isinstance(work, dict) and is_int(work.get("step")) else run_path_fields(path).get("training_step")
    group = (episode or {}).get("group")
    gid = str(group["id"]) if isinstance(group, dict) and isinstance(group.get("id"), str | int) else None
    out: list[dict[str, Any]] = []
    try:
        if not traces:
            return None
        for tr in traces:
            nodes = tr["nodes"]
            if not tr.get("id") or not isinstance(nodes, list):
                return None
            rewards = tr.get("rewards") if isinstance(tr.get("rewards"), dict) else {}
            vals = [r["score"] * r.get("weight", 1.0) for r in rewards.values() if isinstance(r, dict) and isinstance(r.get("score"), int | float)]
            finish = {c["node"]: c.get("finish_reason") for c in tr.get("calls") or [] if isinstance(c, dict) and is_int(c.get("node"))}
            tools = tr.get("tools") or (nodes[0].get("tools") if nodes else None)
            paths = branch_paths(nodes, "trace")
            for bi, br in enumerate(paths):
                n = p = 0
                first = None
                for i in br:
                    ids, mask = nodes[i].get("token_ids") or [], nodes[i].get("mask") or []
                    if len(ids) != len(mask):
                        return None
                    if first is None and True in mask:
                        first = p + mask.index(True)
                    p += len(ids)
                n, p = p, (p if first is None else first)
                if not n:
                    return None  # rendered with the tokenizer when converted
                msgs = [nodes[i].get("message") for i in br]
                user = next((m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"), None)
                last = next((i for i in reversed(br) if nodes[i].get("sampled")), None)
                out.append(_row(f"{tr['id']}-b{bi}" if len(paths) > 1 else str(tr["id"]), "verifiers", p, n, step,
                                float(sum(vals)) if vals else None, group=gid, messages=len(br),
                                turns=sum(1 for i in br if nodes[i].get("sampled")), tools=len(tools) if isinstance(tools, list) else 0,
                                termination_reason=termination_of(tr, finish.get(last)),
                                preview=preview_text(user) if isinstance(user, str) else ""))
    except (RecordError, TypeError, KeyError, AttributeError, ValueError):
        return None
    return out


def dump_summary(raw: bytes, path: str, line: int) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The light row(s) of a line of a rollout dump (verl, prime-rl token export, verifiers
    episode), parsed once and summarised without a tokenizer, or None (not such a row, or one
    the light summary is not sure of: converted in full)."""
    try:
        d = _loads(raw)
    except (ValueError, RecursionError):
        return verl_summary(raw, path, line)  # what orjson refuses (a >64-bit int) the json module may read
    if not isinstance(d, dict):
        return None
    if get_importer("verl").sniff(d):
        return _verl_summary_of(d, path, line)
    if get_importer("prime-rl").sniff(d):
        return prime_rl_summary(d, path)
    if get_importer("verifiers").sniff(d):
        return verifiers_summaries(d, path)
    return None


# ---- the catalogue's hook ---------------------------------------------------------------------------


class ImporterRows:
    """:class:`backend.trace.catalog.ForeignRows` of the importers: how a trace set indexes and
    opens rows of other tools' formats (verl rollout dumps, per-record formats, span files)."""

    def context(self, path: str, tokenizer: str, bundle: Any) -> ImportContext:
        return ImportContext(tokenizer=tokenizer, path=path, _bundle=bundle)

    def dump_summary(self, raw: bytes, path: str, line: int) -> dict[str, Any] | list[dict[str, Any]] | None:
        return dump_summary(raw, path, line)

    def is_span_record(self, d: Any) -> bool:
        return is_span_record(d)

    def span_rows(self) -> SpanGroups:
        return SpanGroups()

    def record_summaries(self, rec: Any, n: int, path: str, ctx: Any) -> list[dict[str, Any]] | LoadProblem | None:
        return summaries_of_record(rec, n, path, ctx)

    def open_line(self, raw: bytes, n: int, row_id: str, path: str, context: Callable[[], Any]) -> Trace | LoadProblem | None:
        """A verl row by the verl importer; else a span trace from the lines its row covers, or
        the conversation of its record."""
        rec = verl_record(raw)
        if rec is not None:
            return open_verl_row(rec, n, path, context())
        where = {"file": os.path.basename(path), "line": n}
        try:
            d = json.loads(raw.split(b"\n", 1)[0].removeprefix(b"\xef\xbb\xbf"))
        except (ValueError, RecursionError):
            return None
        if is_span_record(d):
            return open_span_row(raw, n, row_id, context(), where)
        return open_record_row(d, n, row_id, context(), where, path)

    def open_row(self, row: dict[str, Any], n: int, row_id: str, path: str, context: Callable[[], Any]) -> Trace | LoadProblem:
        return open_record_row(row, n, row_id, context(), {"file": os.path.basename(path), "row": n}, path)


def register() -> None:
    """Give the catalogue (:func:`backend.trace.catalog.register_foreign_rows`) these readers;
    :mod:`backend.importers` calls it when imported."""
    register_foreign_rows(ImporterRows())


__all__ = ["ImporterRows", "SpanGroups", "dump_summary", "is_span_record", "open_record_row", "open_span_row", "open_verl_row", "prime_rl_summary", "register",
           "summaries_of_record", "summary_of_conversation", "verl_id", "verl_record", "verl_summary", "verifiers_summaries"]
