"""OpenAI Responses API request/response logs → conversations.

Accepted records:

* ``{"request": {"model", "instructions", "input": str | [items], "tools": [...], ...},
  "response": {"id", "object": "response", "output": [items], "status", "usage", ...}}``;
* OpenAI Batch API lines for ``/v1/responses``: ``{"custom_id", "url": "/v1/responses", "body":
  {...request}}`` and ``{"custom_id", "response": {"body": {...response}}}``;
* a bare response object (``object: "response"``), or a bare request (``{"model", "input"}``).

The input and output items are the Agents SDK's item types: they are read by
:func:`backend.importers.agents_sdk.items_to_conversation` (instructions → the system message,
an input string → a user message, the output items after the input items). Item types that no
chat message holds (hosted tool calls, ...) are losses with their place (``request.input[3]``,
``response.output[0]``); so are reasoning items whose text is only encrypted, annotations of
output text, and earlier turns the record does not hold (``previous_response_id``,
``conversation``).

Each record is one conversation on its own (a trace set opens one line at a time, and a
trace must not depend on which lines were read before it): a request that continues an earlier
response with ``previous_response_id`` (or ``conversation``) holds only the new items; the
earlier turns are reported as a loss, and the tool outputs it sends answer calls that are not
in the record (reported by the import as results that answer no call).

``status: "incomplete"`` with ``incomplete_details.reason`` ``max_output_tokens`` ends the trace
as ``response_length`` (``content_filter`` as ``content_filter``), the reason recorded as the
finish reason; ``failed`` as ``generation_error``; ``cancelled`` as ``cancelled``.
"""

from __future__ import annotations

import re
from typing import Any

from backend.importers.agents_sdk import items_to_conversation, looks_like_items
from backend.importers.base import Importer, register
from backend.importers.common import Conversation, RecordError, normalize_tools, record_id
from backend.trace.model import TerminationReason

LABEL = "OpenAI Responses"

INCOMPLETE_TO_TERMINATION = {
    "max_output_tokens": TerminationReason.RESPONSE_LENGTH,
    "content_filter": TerminationReason.CONTENT_FILTER,
}
STATUS_TO_TERMINATION = {"failed": TerminationReason.GENERATION_ERROR, "cancelled": TerminationReason.CANCELLED}
_REQUEST_PARAMS = ("model", "temperature", "top_p", "max_output_tokens", "tool_choice", "parallel_tool_calls", "reasoning",
                   "text", "truncation", "store", "previous_response_id", "conversation", "include", "max_tool_calls",
                   "service_tier", "metadata")
_ITEM_PLACE = re.compile(r"^item (\d+)")


def _is_response(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("object") == "response" and isinstance(obj.get("output"), list)


def _is_request(obj: Any) -> bool:
    """A Responses request: ``input`` (text or items), no chat ``messages``, no ``output``."""
    if not isinstance(obj, dict) or "messages" in obj or "output" in obj or "prompt_ids" in obj:
        return False
    inp = obj.get("input")
    return isinstance(inp, str) or (isinstance(inp, list) and (not inp or all(isinstance(x, dict) for x in inp)))


def _parts(record: dict[str, Any]) -> tuple[Any, Any]:
    """``(request, response)`` of a record of any accepted shape (either may be None)."""
    if _is_response(record):
        return None, record
    req, resp = record.get("request"), record.get("response")
    if req is None and isinstance(record.get("body"), dict):  # a Batch API request line
        req = record["body"]
    if isinstance(req, dict) and isinstance(req.get("body"), dict):
        req = req["body"]
    if isinstance(resp, dict) and isinstance(resp.get("body"), dict):  # a Batch API result line
        resp = resp["body"]
    if req is None and resp is None:
        req = record
    return req, resp


def _clean(item: Any) -> Any:
    """An output item as ``model_dump()`` writes it, without the keys it set to None (unset
    fields of the SDK's model), so it reads as the input item it would be sent back as."""
    if isinstance(item, dict):
        return {k: v for k, v in item.items() if v is not None}
    return item


def _extra_losses(item: Any, where: str, losses: list[str]) -> None:
    """What items_to_conversation does not see: output text annotations."""
    if not isinstance(item, dict):
        return
    t = item.get("type")  # encrypted-only reasoning: items_to_conversation reports it
    if t == "message" and isinstance(item.get("content"), list):
        for j, p in enumerate(item["content"]):
            ann = p.get("annotations") if isinstance(p, dict) else None
            if isinstance(ann, list) and ann:
                kinds = sorted({a.get("type") for a in ann if isinstance(a, dict) and isinstance(a.get("type"), str)})
                losses.append(f"{where}.content[{j}]: {len(ann)} annotation(s) ({', '.join(kinds) or 'untyped'}) of the text not carried over")


def _input_items(req: dict[str, Any], place: str) -> list[tuple[Any, str]]:
    """The request's input as ``(item, place)``: a string is one user message."""
    inp = req.get("input")
    if inp is None:
        return []
    if isinstance(inp, str):
        return [({"role": "user", "content": inp}, place)]
    if not isinstance(inp, list):
        raise RecordError(f"{place} must be a string or a list of items, got {type(inp).__name__}")
    return [(x, f"{place}[{k}]") for k, x in enumerate(inp)]


def _convert(record: Any) -> Conversation:
    if not isinstance(record, dict):
        raise RecordError(f"expected a JSON object, got {type(record).__name__}")
    req, resp = _parts(record)
    if req is not None and not isinstance(req, dict):
        raise RecordError(f"request is {type(req).__name__}, not an object")
    if resp is not None and not _is_response(resp):
        raise RecordError("response is not a Responses API response (object \"response\" with an output list)")
    rq = "request" if req is not record else ""
    rs = "response" if resp is not record else ""

    def at(p: str, part: str) -> str:
        return f"{p}.{part}" if p else part

    losses: list[str] = []
    meta: dict[str, Any] = {}
    prov: dict[str, Any] = {"format": LABEL}
    items: list[tuple[Any, str]] = []
    instructions: Any = None
    tools_raw: Any = None
    if req is not None:
        if "input" not in req and resp is None:
            raise RecordError(f"no input: expected {at(rq, 'input')}")
        prev = req.get("previous_response_id")
        if isinstance(prev, str) and prev:
            prov["previous_response_id"] = prev
            losses.append(f"{at(rq, 'previous_response_id')}: the earlier turns (response {prev!r} and before) are not in this "
                          "record: the API kept them")
        conv_ref = req.get("conversation")
        if conv_ref:
            cid = conv_ref.get("id") if isinstance(conv_ref, dict) else conv_ref
            prov["conversation_id"] = cid
            losses.append(f"{at(rq, 'conversation')}: the earlier turns (conversation {cid!r}) are not in this record: the API kept them")
        items.extend(_input_items(req, at(rq, "input")))
        instructions = req.get("instructions")
        tools_raw = req.get("tools")
        params = {k: req[k] for k in _REQUEST_PARAMS if k in req and req[k] is not None}
        if params:
            meta["request"] = params
        if isinstance(req.get("model"), str):
            meta["model"] = req["model"]
    termination = None
    finish = None
    if resp is not None:
        items.extend((_clean(x), at(rs, f"output[{k}]")) for k, x in enumerate(resp["output"]))
        if instructions is None:
            instructions = resp.get("instructions")
        if tools_raw is None:
            tools_raw = resp.get("tools")
        status = resp.get("status")
        if isinstance(status, str):
            meta["status"] = status
        details = resp.get("incomplete_details")
        if status == "incomplete" and isinstance(details, dict) and isinstance(details.get("reason"), str):
            finish = details["reason"]
            meta["finish_reason"] = finish
            termination = INCOMPLETE_TO_TERMINATION.get(finish)
        elif status in STATUS_TO_TERMINATION:
            termination = STATUS_TO_TERMINATION[status]
        if resp.get("error"):
            meta["error"] = resp["error"]
        if isinstance(resp.get("model"), str):
            meta["model"] = resp["model"]
        if isinstance(resp.get("usage"), dict):
            meta["usage"] = resp["usage"]
        if isinstance(resp.get("id"), str):
            prov["response_id"] = resp["id"]
    # instructions: a string (the request's), or input items (a response's, from a prompt template)
    instr_text = instructions if isinstance(instructions, str) else None
    if isinstance(instructions, list):
        items[0:0] = [(x, at(rs or rq, f"instructions[{k}]")) for k, x in enumerate(instructions)]
    elif instructions is not None and not isinstance(instructions, str):
        raise RecordError(f"{at(rq, 'instructions')} must be a string, got {type(instructions).__name__}")
    for x, place in items:
        _extra_losses(x, place, losses)
    places = [p for _, p in items]

    def placed(s: str) -> str:
        return _ITEM_PLACE.sub(lambda m: places[int(m.group(1))] if int(m.group(1)) < len(places) else m.group(0), s)

    try:
        tools = normalize_tools(tools_raw, at(rq if req is not None and req.get("tools") is not None else rs, "tools"))
        conv = items_to_conversation([x for x, _ in items], None, instr_text)
    except RecordError as e:
        raise RecordError(placed(str(e))) from None
    conv.tools = tools
    hosted = sorted({t.get("type") for t in tools_raw or [] if isinstance(t, dict) and t.get("type") not in (None, "function")
                     and "name" not in t and isinstance(t.get("type"), str)})
    if hosted:
        meta["hosted_tools"] = hosted  # web_search, file_search ...: run by the API, no schema to render
    conv.losses = losses + [placed(x) for x in conv.losses]
    conv.metadata = {**meta, **{k: v for k, v in conv.metadata.items() if k != "items"}}
    conv.finish_reason = finish
    conv.termination_reason = termination
    conv.provenance = prov
    conv.id = prov.get("response_id") or record_id(record)
    return conv


@register
class OpenAIResponsesImporter(Importer):
    name = "openai-responses"
    label = LABEL
    description = "OpenAI Responses API request/response logs (and Batch API lines, response objects)"

    def sniff(self, record: Any) -> Any:
        if not isinstance(record, dict):
            return False
        if _is_response(record):
            return "a response object (object \"response\", output items)"
        req, resp = record.get("request"), record.get("response")
        if isinstance(resp, dict) and isinstance(resp.get("body"), dict):
            resp = resp["body"]
        if _is_response(resp):
            return "a response of object \"response\""
        if isinstance(req, dict) and isinstance(req.get("body"), dict):
            req = req["body"]
        if _is_request(req):
            return "a request with input and no messages"
        if record.get("url") == "/v1/responses" and isinstance(record.get("body"), dict):
            return "a Batch API request to /v1/responses"
        if "request" not in record and "response" not in record and isinstance(record.get("model"), str) and _is_request(record):
            inp = record["input"]
            if isinstance(inp, str) or looks_like_items(inp) or "instructions" in record:
                return "a request with model and input"
        return False

    def convert(self, record: Any, ctx) -> list[Conversation]:
        return [_convert(record)]
