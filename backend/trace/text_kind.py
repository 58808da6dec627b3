"""What a text file's first bytes say it is, and why a JSON document does not parse.

:func:`backend.trace.io.sniff` asks this module before it reads a file as JSONL, so that a file
that is not JSONL gets one problem that says what it is instead of one problem per line:

* :func:`looks_binary`: bytes that are not text (a NUL, or, where the file does not start as JSON
  does, control bytes or bytes that are not UTF-8);
* :func:`markup_reason`: a file that starts with ``<`` (an HTML page, an XML document), with the
  JSON file to read instead where a tool writes its HTML beside one (:data:`JSON_TWINS`);
* :func:`spans_lines`: a file that starts with ``{`` or ``[`` whose first line is no complete JSON
  value, and no line after it is one either: one JSON document written over many lines
  (pretty-printed), not JSONL with a damaged first line;
* :func:`read_document`: a whole document parsed once, or the one problem that says where json
  stopped: ``the JSON document ends early at line L, column C: truncated?`` when the text ran out
  (the position is the file's end), else ``invalid JSON at line L, column C: <json's message>``.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

from backend.trace.limits import LoadProblem, human_bytes

HEAD_BYTES = 1 << 16  # how much of a file is looked at before it is read
BINARY_HEAD_BYTES = 4096  # where a NUL or a control byte makes a file binary

# A tool that writes an HTML page beside the JSON file that holds the same data: (a marker in the
# page's first HEAD_BYTES, what to read instead). tinker-cookbook's logtree writes train.html next
# to train_logtree.json (backend/importers/tinker.py); its pages carry the logtree's root class.
JSON_TWINS: tuple[tuple[bytes, str], ...] = (
    (b"lt-root", "tinker-cookbook's logtree page; read train_logtree.json, written beside it"),
)

_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f\x7f]")
# what is left where json stopped when a document was cut inside a number or a literal
_CUT_TOKEN = re.compile(r"[-+0-9.eE]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|N(aN?)?|-?I(n(f(i(n(i(ty?)?)?)?)?)?)?")


def body_of(head: bytes) -> bytes:
    """The head without a byte-order mark and leading white space: where the content starts."""
    return head.removeprefix(codecs.BOM_UTF8).lstrip()


def looks_binary(head: bytes) -> bool:
    """Whether a file's first bytes are not text. A file that starts as JSON does (``{``, ``[``)
    is text with some bad bytes at worst: its lines say where."""
    first = head[:BINARY_HEAD_BYTES]
    if b"\x00" in first:
        return True
    body = body_of(first)
    if body[:1] in (b"{", b"["):
        return False
    if _CONTROL.search(body):
        return True
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return not (e.end == len(body) and e.reason == "unexpected end of data")  # a character cut by the head's end
    return False


def markup_reason(name: str, head: bytes) -> str | None:
    """Why a file that starts with ``<`` is no trace file (None when it does not)."""
    body = body_of(head)
    if not body.startswith(b"<"):
        return None
    low = body[:1024].lower()
    if low.startswith((b"<!doctype html", b"<html")) or b"<html" in low:
        what = "an HTML document"
    elif low.startswith(b"<?xml"):
        what = "an XML document"
    else:
        what = "markup (HTML or XML)"
    reason = f"{name} is {what}, not a trace file"
    for marker, instead in JSON_TWINS:
        if marker in head:
            return f"{reason}: {instead}"
    return reason


def _whole_container(line: bytes) -> bool:
    """Whether one line alone is a complete JSON object or array."""
    try:
        return isinstance(json.loads(line.removeprefix(codecs.BOM_UTF8)), (dict, list))
    except (ValueError, RecursionError):
        return False


def spans_lines(head: bytes, whole: bool, look: int = 8) -> bool:
    """Whether a file whose first ``HEAD_BYTES`` are ``head`` (``whole``: the head is the whole
    file) is one JSON document over many lines: it starts with ``{`` or ``[``, its first line
    does not end as a JSON object or array does (so it is no complete record), and none of the
    next ``look`` lines is a complete object or array (a JSONL file with a damaged first line has
    whole records after it). A file whose head shows fewer than ``look`` whole lines after the
    first is JSONL (a pretty-printed document's lines are short, a JSONL record's may each be
    longer than the head: a prime-rl export's are); a file of one line is a document only if json
    runs out of text on it (cut after ``{``), else one bad JSONL record. Only such files have
    lines parsed here."""
    body = body_of(head)
    if body[:1] not in (b"{", b"["):
        return False
    lines = body.split(b"\n")
    if not whole:
        lines = lines[:-1]  # the last one may be cut by the head's end
    lines = [ln for ln in lines if ln.strip()]
    if not lines or lines[0].rstrip().endswith((b"}", b"]")):
        return False  # a whole record (or one damaged in its middle): JSONL, each line says why; not parsed here
    following = lines[1 : 1 + look]
    if not following:
        # one line: a document cut after it (``{``) if json runs out of text there, else a JSONL
        # file of one bad record, whose problem names its line
        return whole and _runs_out(lines[0])
    if not whole and len(following) < look:
        # lines too long for the head to show `look` of them: JSONL records (a prime-rl export's
        # are longer than the head), not a pretty-printed document, whose lines are short
        return False
    return not any(_whole_container(ln) for ln in following)


def _runs_out(line: bytes) -> bool:
    """Whether json stops on ``line`` because the text ran out (a cut), not at a wrong character."""
    text = line.decode("utf-8", errors="replace")
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        return _ends_early(text, e)
    return False


def _position(text: str, end: int) -> tuple[int, int]:
    """(line, column), 1-based, of ``text[end]``."""
    return text.count("\n", 0, end) + 1, end - (text.rfind("\n", 0, end) + 1) + 1


def _ends_early(text: str, e: json.JSONDecodeError) -> bool:
    """Whether json stopped because the text ran out (not at a wrong character)."""
    rest = text[e.pos :].strip()
    if not rest or e.msg.startswith("Unterminated string"):
        return True
    if e.msg.startswith("Invalid \\uXXXX escape") and len(rest) <= 6:
        return True
    return len(rest) <= 32 and _CUT_TOKEN.fullmatch(rest) is not None


def read_document(raw: bytes) -> Any:
    """``raw`` (a whole file) parsed as one JSON document, or the :class:`LoadProblem` that says
    why not (its line: where json stopped). One parse: the reason comes from json's own error."""
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.end == len(raw) and e.reason == "unexpected end of data":  # cut inside a character
            text = raw[: e.start].decode("utf-8", errors="replace")
            return _early(text)
        line = raw.count(b"\n", 0, e.start) + 1
        return LoadProblem(line, f"the JSON document is not valid UTF-8 at byte {e.start + 1:,} (line {line})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if _ends_early(text, e):
            return _early(text)
        return LoadProblem(e.lineno, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}")
    except RecursionError:
        return LoadProblem(1, "the JSON document is nested too deeply to read")
    except ValueError as e:  # an integer literal too long for int()
        return LoadProblem(1, f"invalid JSON: {str(e).split(';')[0]}")


def _early(text: str) -> LoadProblem:
    line, col = _position(text, len(text))
    return LoadProblem(line, f"the JSON document ends early at line {line}, column {col}: truncated?")


def too_big_reason(name: str, size: int, limit: int) -> str:
    """Why a document over many lines, not named ``.json``, is not read: it is read whole, and
    only a ``.json`` file may be longer than one line may be."""
    return (f"{name} is one JSON document written over many lines ({human_bytes(size)}), not JSONL; it is read whole "
            f"only when named .json or no longer than the {human_bytes(limit)} line limit (ALI_MAX_TRACE_LINE_BYTES)")
