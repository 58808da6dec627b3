"""verifiers rollout records → traces.

verifiers (0.4, ``verifiers.v1``) saves each rollout as an **episode** (``Episode``: ``id``,
``env``, ``task``, ``group``, ``run``, ``ok``, ``errors``, ``traces``), one JSON line each: its
trace store writes ``traces.jsonl`` (``verifiers.v1.utils.trace_store.write_episode``) and
prime-rl's run folder keeps the same records under ``rollouts/step_<N>/<kind>/<subset>/traces.jsonl``
(``Episode.to_record()``). A trace is a **message graph**: ``nodes``, each one message with the
tokens it adds to the sequence (``token_ids``), a ``mask`` (true on the model-sampled tokens:
an assistant node's completion, after its generation-prompt scaffold), ``logprobs`` over those
sampled tokens, and where a trainer annotated them ``advantages``, ``reference_logprobs``,
``trainer_logprobs`` and ``entropies`` in the same compact layout; ``parent`` links them.
Each root-to-leaf path (a **branch**: verifiers' training sample) becomes one trace:

* ids and mask are the nodes' own, concatenated along the path, kept exactly
  (``metadata.ids = "given"``); the prompt is every token before the first sampled one. Steps
  follow the nodes: the prompt, then per sampled node a generating step (its completion, with
  its ``logprobs`` as rollout logprobs and ``trainer_logprobs`` — else ``reference_logprobs`` —
  as ``info.trainer_logprobs``, ``trace.scorer`` naming which), the scaffold and tool / user
  nodes between two completions as a processing step. The messages are the nodes' messages
  (not decoded text); an assistant text that its ids do not decode to is refused.
* a branch with no token ids (an eval run through a relaying client) is a conversation,
  rendered with the chosen tokenizer (``metadata.ids = "rendered"``).
* metadata: ``training_step`` (``run.work.step``, else a ``step_<N>`` folder), ``group``
  (``group.id``), ``rewards`` (name → score), ``score`` (verifiers' ``Trace.reward``: the sum of
  score × weight), ``advantage``; the rest (stop condition, metrics, info, env, run, task, calls,
  the nodes' other fields) under ``metadata.extra``.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, normalize_tools, results_of, text_of
from backend.importers.rollout_fields import advantage_of, as_step_floats, bools, floats, ints, is_int, run_path_fields
from backend.trace import MessageSpan, ParseError, ToolCall
from backend.trace.builder import TraceBuilder
from backend.trace.messages import json_type
from backend.trace.model import Scorer, StepInfo, StepState, TerminationReason

_STOPS = {
    "max_output_tokens": TerminationReason.RESPONSE_LENGTH, "max_total_tokens": TerminationReason.RESPONSE_LENGTH,
    "max_input_tokens": TerminationReason.RESPONSE_LENGTH, "max_turns": TerminationReason.MAX_ASSISTANT_TURNS,
}
_NODE_KEPT = ("token_ids", "mask", "logprobs", "advantages", "reference_logprobs", "trainer_logprobs", "entropies", "message", "tools")
_TRACE_KEPT = ("nodes", "tools", "rewards", "id", "verifiers")
_COMPACT = ("advantages", "reference_logprobs", "trainer_logprobs", "entropies")


def traces_of(rec: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Any]]:
    if isinstance(rec.get("traces"), list):
        return rec, rec["traces"]
    return None, [rec]


def branch_paths(nodes: list[Any], where: str) -> list[list[int]]:
    """verifiers' branches: for each leaf (a node no node names as parent), its root-to-leaf path."""
    parents: list[int | None] = []
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise RecordError(f"{where}.nodes[{i}] is {json_type(n)}, not a node object")
        p = n.get("parent")
        if p is not None and not (is_int(p) and 0 <= p < i):
            raise RecordError(f"{where}.nodes[{i}].parent must name an earlier node, got {p!r}")
        parents.append(p)
    has_child = {p for p in parents if p is not None}
    out = []
    for leaf in (i for i in range(len(nodes)) if i not in has_child):
        path: list[int] = []
        cur: int | None = leaf
        while cur is not None:
            path.append(cur)
            cur = parents[cur]
        out.append(path[::-1])
    return out


def _message(msg: Any, where: str, losses: list[str]) -> tuple[dict[str, Any], list[ParseError]]:
    """A verifiers message (system / user / assistant / tool) in HF chat format."""
    if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
        raise RecordError(f"{where} must be a system, user, assistant or tool message")
    role = msg["role"]
    out: dict[str, Any] = {"role": role, "content": text_of(msg.get("content"), where, losses) or ""}
    errs: list[ParseError] = []
    if role == "assistant":
        if isinstance(msg.get("reasoning_content"), str):
            out["reasoning_content"] = msg["reasoning_content"]
        calls = []
        for j, c in enumerate(msg.get("tool_calls") or []):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise RecordError(f"{where}.tool_calls[{j}] has no name")
            raw = c.get("arguments")
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError as e:
                args = raw
                errs.append(ParseError(message=f"tool call {c['name']!r}: arguments are not JSON ({e})", raw=raw))
            calls.append({"id": c.get("id"), "type": "function", "function": {"name": c["name"], "arguments": args}})
        if calls:
            out["tool_calls"] = calls
        for k in ("provider_state",):
            if msg.get(k):
                losses.append(f"{where}.{k}: provider state not carried over")
    elif role == "tool":
        out["tool_call_id"] = msg.get("tool_call_id")
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
    return out, errs


def _node_tokens(n: dict[str, Any], where: str) -> tuple[list[int], list[bool], int]:
    """A node's ids and mask, checked: the mask as long as the ids, the sampled tokens one run
    at the end (verifiers' layout), the compact columns one value per sampled token."""
    ids = ints(n.get("token_ids", []), f"{where}.token_ids")
    mask = bools(n.get("mask", []), f"{where}.mask")
    if len(mask) != len(ids):
        raise RecordError(f"{where}.mask has {len(mask)} values for {len(ids)} token ids")
    c = sum(mask)
    if c and not all(mask[len(mask) - c :]):
        raise RecordError(f"{where}.mask: the sampled tokens are not one run at the end of the node")
    if c and not n.get("sampled"):
        raise RecordError(f"{where}: a node that was not sampled has {c} sampled token(s) in its mask")
    if c or n.get("logprobs"):
        floats(n.get("logprobs"), f"{where}.logprobs", c)
    for k in _COMPACT:
        if n.get(k) is not None:
            floats(n[k], f"{where}.{k}", c)
    return ids, mask, c


def termination_of(tr: dict[str, Any], last_finish: str | None) -> str | None:
    stop = tr.get("stop_condition")
    if last_finish == "length":
        return TerminationReason.RESPONSE_LENGTH
    if stop in _STOPS:
        return _STOPS[stop]
    if stop == "agent_completed":
        return TerminationReason.NO_TOOL_CALLS
    if isinstance(stop, str) and stop.endswith("_timeout"):
        return TerminationReason.TIME_LIMIT
    if isinstance(stop, str) and stop.endswith("error"):
        return TerminationReason.ERROR
    return stop if isinstance(stop, str) else None


@register
class VerifiersImporter(Importer):
    name = "verifiers"
    label = "verifiers"
    description = "verifiers episodes (traces.jsonl of message graphs: per-node token_ids, mask, logprobs; prime-rl rollouts/)"

    def sniff(self, record: Any) -> Any:
        if not isinstance(record, dict):
            return False
        tr = record.get("traces")
        if isinstance(tr, list) and "task" in record and (not tr or (isinstance(tr[0], dict) and "nodes" in tr[0])):
            return "verifiers episode (traces of message nodes)"
        if isinstance(record.get("nodes"), list) and isinstance(record.get("verifiers"), dict):
            return "verifiers trace (message nodes)"
        return False

    def convert(self, record: Any, ctx) -> list[Any]:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {json_type(record)}")
        episode, traces = traces_of(record)
        if not traces:
            errs = "; ".join(str(e.get("message", e))[:200] for e in record.get("errors") or [] if isinstance(e, dict))
            raise RecordError("verifiers episode with no trace" + (f" (errors: {errs})" if errs else " (no error recorded)"))
        out: list[Any] = []
        for ti, tr in enumerate(traces):
            where = f"traces[{ti}]" if episode is not None else "trace"
            if not isinstance(tr, dict) or not isinstance(tr.get("nodes"), list):
                raise RecordError(f"{where} has no nodes list")
            paths = branch_paths(tr["nodes"], where)
            for bi, path in enumerate(paths):
                out.append(self._branch(episode, tr, path, bi, len(paths), where, ctx))
        return out

    # ---- one branch -------------------------------------------------------------------------------

    def _branch(self, episode: dict[str, Any] | None, tr: dict[str, Any], path: list[int], bi: int, nb: int, where: str, ctx) -> Any:
        nodes = [tr["nodes"][i] for i in path]
        losses: list[str] = []
        toks = [_node_tokens(n, f"{where}.nodes[{i}]") for i, n in zip(path, nodes)]
        msgs, errs = zip(*(_message(n.get("message"), f"{where}.nodes[{i}].message", losses) for i, n in zip(path, nodes)))
        messages = list(msgs)
        tools = normalize_tools(tr.get("tools") or (nodes[0].get("tools") if nodes else None), f"{where}.tools")
        calls = [c for c in tr.get("calls") or [] if isinstance(c, dict)]
        finish = {c["node"]: c.get("finish_reason") for c in calls if is_int(c.get("node"))}
        last_sampled = next((i for i in reversed(path) if tr["nodes"][i].get("sampled")), None)
        term = termination_of(tr, finish.get(last_sampled))
        meta = self._metadata(episode, tr, path, nodes, bi, nb, ctx)
        tid = str(tr.get("id") or "") or None
        if tid and nb > 1:
            tid = f"{tid}-b{bi}"
        prov = {"format": self.label, "library": "verifiers"}
        vinfo = tr.get("verifiers") if isinstance(tr.get("verifiers"), dict) else {}
        prov.update({k: vinfo[k] for k in ("version", "commit") if isinstance(vinfo.get(k), str)})
        if tr.get("id"):
            prov["trace_id"] = str(tr["id"])
        if episode is not None and episode.get("id"):
            prov["episode_id"] = str(episode["id"])
        if not any(ids for ids, _, _ in toks):  # no token ids (a relayed eval run): rendered
            conv = Conversation(messages=messages, tools=tools, metadata=meta, id=tid, termination_reason=term, losses=losses,
                                parse_errors={k: list(e) for k, e in enumerate(errs) if e})
            conv.provenance = prov
            return conv
        trace = self._given(nodes, path, toks, messages, list(errs), finish, term, tools, meta, tid, ctx, where)
        trace.metadata["provenance"] = prov
        if losses:
            trace.metadata["import"] = {"losses": losses}
        return trace

    def _metadata(self, episode, tr, path, nodes, bi, nb, ctx) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        pf = run_path_fields(ctx.path)
        if "training_step" in pf:
            meta["training_step"] = pf["training_step"]
        run = (episode or {}).get("run")
        work = run.get("work") if isinstance(run, dict) else None
        if isinstance(work, dict) and is_int(work.get("step")):
            meta["training_step"] = work["step"]
        group = (episode or {}).get("group")
        if isinstance(group, dict) and isinstance(group.get("id"), str | int):
            meta["group"] = str(group["id"])
        rewards = tr.get("rewards") if isinstance(tr.get("rewards"), dict) else {}
        if rewards:
            meta["rewards"] = {k: (r.get("score") if isinstance(r, dict) else None) for k, r in rewards.items()}
            vals = [r["score"] * r.get("weight", 1.0) for r in rewards.values() if isinstance(r, dict) and isinstance(r.get("score"), int | float)]
            if vals:
                meta["score"] = float(sum(vals))
        adv = [a for n in nodes if n.get("advantages") is not None for a in n["advantages"]]
        a = advantage_of(adv)
        if a is not None:
            meta["advantage"] = a
        extra: dict[str, Any] = {k: tr[k] for k in tr if k not in _TRACE_KEPT}
        weights = {k: r.get("weight") for k, r in rewards.items() if isinstance(r, dict) and r.get("weight", 1.0) != 1.0}
        if weights:
            extra["reward_weights"] = weights
        if episode is not None:
            extra["episode"] = {k: v for k, v in episode.items() if k != "traces"}
        extra.update({k: v for k, v in pf.items() if k in ("kind", "subset")})
        extra["nodes"] = [{"index": i, **{k: v for k, v in n.items() if k not in _NODE_KEPT}} for i, n in zip(path, nodes)]
        if nb > 1:
            extra["branch"] = {"index": bi, "of": nb}
        meta["extra"] = extra
        return meta

    def _given(self, nodes, path, toks, messages, errs, finish, term, tools, meta, tid, ctx, where):
        bundle = ctx.bundle
        tok = bundle.tokenizer
        ids = [t for n_ids, _, _ in toks for t in n_ids]
        mask = [m for _, n_mask, _ in toks for m in n_mask]
        starts = [0, *accumulate(len(n_ids) for n_ids, _, _ in toks)]
        p = next((k for k, m in enumerate(mask) if m), len(ids))
        b = TraceBuilder(vocab_size=len(tok), tokenizer_name=bundle.name, imported=True)
        b.set_prompt(ids[:p])
        b.set_response(ids[p:], [int(m) for m in mask[p:]])
        b.messages = messages
        for k in range(len(nodes)):
            b.add_span(MessageSpan(message=k, start=starts[k], end=starts[k + 1]))

        def decode(a: int, z: int) -> str:
            return tok.decode(ids[a:z], skip_special_tokens=False)

        sampled = [k for k, (_, _, c) in enumerate(toks) if c]
        first = sampled[0] if sampled else len(nodes)
        b.add_step(b.step(StepState.PENDING, start=0, end=p, text=decode(0, p), messages_added=list(range(first))))
        scorer = None
        prev_end, prev_k = p, first
        for k in sampled:
            n, c = nodes[k], toks[k][2]
            cs, ce = starts[k + 1] - c, starts[k + 1]
            between = [j for j in range(prev_k + 1, k)] if k != first else []
            if cs > prev_end or between:
                b.add_step(b.step(StepState.PROCESSING_TOOLS, start=prev_end, end=cs, mask=0, text=decode(prev_end, cs),
                                  messages_added=between, tool_results=results_of(messages, between)))
            text = decode(cs, ce)
            self._check_text(messages[k], text, f"{where}.nodes[{path[k]}]", bundle.name)
            info: dict[str, Any] = {}
            tl = n.get("trainer_logprobs")
            if tl is None and n.get("reference_logprobs") is not None:
                tl, scorer = n["reference_logprobs"], scorer or "verifiers reference_logprobs"
            elif tl is not None:
                scorer = "verifiers trainer_logprobs"
                if n.get("reference_logprobs") is not None:
                    info["reference_logprobs"] = n["reference_logprobs"]
            for key in ("advantages", "entropies"):
                if n.get(key) is not None:
                    info[key] = n[key]
            calls = [ToolCall(name=x["function"]["name"], arguments=x["function"]["arguments"], id=x.get("id"))
                     for x in messages[k].get("tool_calls") or []]
            b.add_step(b.step(
                StepState.GENERATING, start=cs, end=ce, mask=1, text=text, messages_added=[k], tool_calls=calls,
                parse_errors=errs[k], logprobs=as_step_floats(n.get("logprobs") or []) if c else None,
                finish_reason=finish.get(path[k]),
                info=StepInfo(imported=True, trainer_logprobs=as_step_floats(tl) if tl is not None else None, **info),
            ))
            prev_end, prev_k = ce, k
        rest = list(range(prev_k + 1, len(nodes))) if sampled else []
        if rest or prev_end < len(ids):
            b.add_step(b.step(StepState.PROCESSING_TOOLS, start=prev_end, end=len(ids), mask=0, text=decode(prev_end, len(ids)),
                              messages_added=rest, tool_results=results_of(messages, rest)))
        b.terminate(term)
        trace = b.build(termination_reason=term, tools=tools, tokenizer=bundle.info(),
                        metadata={"source": self.name, **meta, "ids": "given", "mask": "given"}, **({"id": tid} if tid else {}))
        if scorer is not None:
            trace.scorer = Scorer(kind=scorer)
        return trace

    @staticmethod
    def _check_text(msg: dict[str, Any], text: str, where: str, tokenizer: str) -> None:
        """The file stores both the message and its ids: its text must be in what the ids decode
        to (else the ids are another tokenizer's, or the message was rewritten after sampling)."""
        for part in (msg.get("content"), msg.get("reasoning_content")):
            if isinstance(part, str) and part.strip() and part.strip() not in text:
                raise RecordError(f"{where}: the assistant text {part.strip()[:40]!r} is not what its token ids decode to with "
                                  f"tokenizer {tokenizer!r} ({text[:40]!r}); import with the tokenizer the run used")
        for c in msg.get("tool_calls") or []:
            if c["function"]["name"] not in text:
                raise RecordError(f"{where}: tool call {c['function']['name']!r} is not in what its token ids decode to "
                                  f"with tokenizer {tokenizer!r}")
