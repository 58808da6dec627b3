"""YAML documents of unknown origin (ART's ``trajectories/<split>/<step>.yaml`` logs): read bounded.

Three things make a YAML file costlier than its size, and each is checked on the parser's event
stream (:func:`yaml.parse`: libyaml's parser keeps its own stack, so it neither recurses nor builds
anything) before any Python object is constructed:

* **aliases** ("billion laughs"): ``&a [x, x]``, ``&b [*a, *a]``, ... doubles at each line; a
  1.2 KB file of 30 such lines stands for 2·10⁹ values. The constructor shares an anchored object
  between its aliases, so construction is cheap, but everything that walks the records afterwards
  (hashing a record, JSON, rendering) pays for the expanded tree. The scan adds up what each anchor
  stands for (values, text bytes, depth) and refuses a document whose *expanded* size is over the
  limits below; an alias of an anchor that is not yet closed (a recursive document) is refused too;
* **nesting**: libyaml's composer recurses in C (10⁶ nested ``[`` kill the process with a
  segmentation fault, measured with PyYAML 6.0.3): the nesting, with what aliases add, is kept to
  :data:`MAX_DEPTH`;
* **tags**: only PyYAML's ``SafeLoader`` constructors run (``CSafeLoader``; never a full loader);
  what comes out is made plain JSON values (timestamps as ISO text, keys as text); binary and set
  values are refused.

Limits, read at each call: the file itself at most ``ALI_MAX_YAML_BYTES`` (8 MiB). A YAML
document is read whole, and PyYAML costs far more than JSON: measured (2 shared cores, other
jobs running) on ART's own log repeated to 4 MiB (376,543 values, short strings): 9.4 s and 200 MB
of peak memory (the event scan 2.1 s of it); to 16 MiB: 58 s and 802 MB; so ~25 s and ~0.4 GB at
the limit for that shape (long message texts cost less per byte). Expanded, at most
``ALI_MAX_FILE_VALUES`` values (:func:`backend.trace.limits.max_file_values`, 8·10⁶, the count a
Parquet file may decode to) and ``ALI_MAX_FILE_TEXT_BYTES`` bytes of text (256 MiB). A file cut in
the middle of a line (no final newline: PyYAML's ``dump`` always ends with one) is refused as
truncated; a cut at a line boundary can leave valid YAML, which only the format's own checks catch.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import yaml

from backend.trace.limits import TraceFileError, human_bytes, max_file_text_bytes, max_file_values

MAX_DEPTH = 64
DEFAULT_MAX_YAML_BYTES = 8 << 20
SUFFIXES = (".yaml", ".yml")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def max_yaml_bytes() -> int:
    """``ALI_MAX_YAML_BYTES``, read at each call (default :data:`DEFAULT_MAX_YAML_BYTES`)."""
    raw = os.environ.get("ALI_MAX_YAML_BYTES", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_YAML_BYTES


class YamlRefused(TraceFileError):
    """The YAML file is not read; the message says why."""


def is_yaml_path(path: str) -> bool:
    return str(path).lower().endswith(SUFFIXES)


def _where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(what)


def check_events(data: bytes, *, max_values: int, max_text: int, max_depth: int = MAX_DEPTH) -> tuple[int, int]:
    """``(values, text bytes)`` of the document once its aliases are expanded, from the event
    stream alone; :class:`YamlRefused` when over a limit, recursive, several documents or not YAML."""
    anchors: dict[str, tuple[int, int, int]] = {}  # anchor -> (values, text bytes, depth) it stands for
    stack: list[list[Any]] = [[0, 0, 0, None]]  # per open collection: values, text bytes, depth below, anchor
    values = text = docs = 0

    def add(v: int, t: int, d: int) -> None:
        nonlocal values, text
        top = stack[-1]
        top[0] += v
        top[1] += t
        top[2] = max(top[2], d)
        values += v
        text += t
        if values > max_values:
            raise YamlRefused(f"its aliases expand it to over {max_values:,} values (the limit, ALI_MAX_FILE_VALUES)")
        if text > max_text:
            raise YamlRefused(f"its aliases expand it to over {human_bytes(max_text)} of text (the limit, ALI_MAX_FILE_TEXT_BYTES)")
        if len(stack) - 1 + d > max_depth:
            raise YamlRefused(f"it is nested over {max_depth} levels deep")

    try:
        for ev in yaml.parse(data, Loader=_LOADER):
            if isinstance(ev, yaml.DocumentStartEvent):
                docs += 1
                if docs > 1:
                    raise YamlRefused("it holds several YAML documents (one is read)")
            elif isinstance(ev, _OPEN):
                if len(stack) > max_depth:
                    raise YamlRefused(f"it is nested over {max_depth} levels deep")
                stack.append([0, 0, 0, ev.anchor])
                add(1, 0, 0)  # the collection itself
            elif isinstance(ev, _CLOSE):  # its contents were counted as they came: only its parent learns of it
                v, t, d, anchor = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (v, t, d + 1)
                top = stack[-1]
                top[0] += v
                top[1] += t
                top[2] = max(top[2], d + 1)
            elif isinstance(ev, yaml.ScalarEvent):
                t = len(ev.value.encode("utf-8", "surrogatepass"))
                if ev.anchor is not None:
                    anchors[ev.anchor] = (1, t, 0)
                add(1, t, 0)
            elif isinstance(ev, yaml.AliasEvent):
                if ev.anchor not in anchors:
                    raise YamlRefused(f"alias *{ev.anchor} refers to an anchor that is not defined before it (or to a collection that holds it)")
                add(*anchors[ev.anchor])
    except yaml.YAMLError as e:
        raise YamlRefused(f"not valid YAML: {_where(e)}") from None
    return values, text


def _plain(v: Any, where: str = "", memo: dict[int, Any] | None = None) -> Any:
    """The constructed document as JSON values (the depth is bounded by :func:`check_events`). An
    anchored collection is converted once and shared by its aliases, as the constructor shares it:
    memory stays that of the file's own nodes."""
    memo = {} if memo is None else memo
    if isinstance(v, (dict, list)) and id(v) in memo:
        return memo[id(v)]
    if isinstance(v, dict):
        out: dict[str, Any] = memo.setdefault(id(v), {})
        for k, x in v.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise YamlRefused(f"{where or 'the document'} has a {type(k).__name__} key, not text")
            key = k if isinstance(k, str) else yaml.safe_dump(k).splitlines()[0]
            out[key] = _plain(x, f"{where}.{key}" if where else key, memo)
        return out
    if isinstance(v, list):
        items: list[Any] = memo.setdefault(id(v), [])
        items.extend(_plain(x, f"{where}[{i}]", memo) for i, x in enumerate(v))
        return items
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if isinstance(v, (bytes, set)):
        raise YamlRefused(f"{where or 'the document'} is a YAML {'!!binary' if isinstance(v, bytes) else '!!set'} value (not read)")
    return v


def read_yaml(path: str) -> Any:
    """The one YAML document of ``path`` as JSON values, or :class:`YamlRefused` saying why."""
    from backend.trace import io as _io  # its limits are read at each call (tests set them)

    name = os.path.basename(path)
    limit = min(max_yaml_bytes(), _io.DEFAULT_MAX_FILE_BYTES)
    size = os.path.getsize(path)
    if size > limit:
        raise YamlRefused(f"{name} is {human_bytes(size)}, over the {human_bytes(limit)} limit for a YAML file "
                          "(read whole; ALI_MAX_YAML_BYTES raises it, or convert the file to JSON)")
    with open(path, "rb") as f:
        data = f.read()
    if b"\x00" in data[:4096]:
        raise YamlRefused(f"{name} looks like a binary file, not YAML text")
    try:
        if data and not data.endswith(b"\n"):
            raise YamlRefused("it does not end with a newline: the file looks truncated (a YAML writer ends its last line)")
        check_events(data, max_values=max_file_values(), max_text=max_file_text_bytes())
        try:
            doc = yaml.load(data, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader / SafeLoader)
        except yaml.YAMLError as e:
            raise YamlRefused(f"not valid YAML: {_where(e)}") from None
        return _plain(doc)
    except YamlRefused as e:
        raise YamlRefused(f"{name} not read: {e}") from None
