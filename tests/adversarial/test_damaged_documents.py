"""A damaged JSON document, an HTML page or binary bytes given as a trace file: one problem that
says what the file is (and, for a document, where json stopped), not one problem per line.

The documents are tinker-cookbook's logtree (``train_logtree.json``, written by tinker-cookbook
itself: tests/fixtures_gen/gen_tinker.py) cut short at several points or with one syntax error put
in; the HTML page is that logtree's twin, ``train.html``, written by tinker-cookbook's logtree
(tests/fixtures_gen/gen_tinker_html.py). The positions expected for a document cut short are
counted from the bytes kept (where the file ends), those of a syntax error are the line edited and
what Python's json module says. Every entry point: load_traces, load_any, the import, the trace
index, a trace set, the Trace files upload and the command line. A JSONL file with bad lines
(its first line among them) keeps its per-line problems."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from cli_inprocess import run_cli

from backend.importers import import_file, load_any
from backend.trace import TraceFileError, TraceIndex, load_traces
from backend.trace.catalog import TraceSet

ROOT = Path(__file__).resolve().parents[2]
LOGTREE = ROOT / "tests" / "data" / "import" / "tinker" / "iteration_000003" / "train_logtree.json"
TRAIN_HTML = ROOT / "tests" / "data" / "import" / "tinker" / "html" / "train.html"
SAMPLE = ROOT / "sample_traces" / "01_weather.jsonl"


def end_of(data: bytes) -> tuple[int, int]:
    """(line, column), 1-based, just after the last byte of ``data`` (where a cut file ends)."""
    text = data.decode("utf-8", errors="replace")
    return text.count("\n") + 1, len(text) - (text.rfind("\n") + 1) + 1


def cut_points() -> list[int]:
    """Where the logtree is cut: after its first line, inside a string, after a comma, after an
    opening brace, inside a number and a literal where there are some, and seeded random points."""
    data = LOGTREE.read_bytes()
    pts = [2, data.index(b'"RL Iter') + 5, data.index(b",\n") + 1, data.index(b"{", 5) + 1]
    for pat in (b"true", b"false", b"null"):
        i = data.find(pat)
        if i > 0:
            pts.append(i + 2)
    i = data.find(b": 0.")
    if i > 0:
        pts.append(i + 4)
    rng = random.Random(20261128)
    pts += sorted(rng.randrange(10, len(data) - 3) for _ in range(6))
    pts.append(len(data) - 3)  # the last closing braces missing
    return pts


@pytest.fixture(scope="module")
def ui_ctx():
    from ui.context import AppContext, load_samples

    samples, problems = load_samples()
    assert not problems
    return AppContext(samples=samples)


def ui_load(ctx, path: Path):
    from ui import trace_files
    from ui.context import new_session

    sess = new_session(ctx)
    status, probs = trace_files.load_file(ctx, sess, str(path))
    return sess, status, probs


def one_problem_everywhere(path: Path, want: str, line: int, ctx, tmp_path: Path) -> None:
    """Every reader gives no trace and exactly one problem, ``want`` (at ``line``)."""
    for name, res in (("load_traces", load_traces(str(path))), ("load_any", load_any(str(path))),
                      ("load_any import", load_any(str(path), import_foreign=True)),
                      ("import auto", import_file(str(path), "auto")), ("import tinker", import_file(str(path), "tinker"))):
        assert not res.traces, name
        assert [(p.line, p.reason) for p in res.problems] == [(line, want)], name
    table = TraceIndex.build([str(path)], validate=True)
    assert len(table) == 0 and [(p.line, p.reason) for p in table.problems] == [(line, want)]
    # the Trace files upload: a status and a Bad records table of one row
    sess, status, probs = ui_load(ctx, path)
    assert "0 trace(s) loaded" in status and "1 bad record" in status, status
    assert list(zip(probs["line"], probs["problem"])) == [(line, want)]
    # the command line: one error line, exit 2
    for cmd in (["check", str(path), "--no-tokens"], ["import", str(path), "--out", str(tmp_path / "o.jsonl")]):
        p = run_cli(*cmd)
        assert p.returncode == 2, (cmd[0], p.returncode, p.stdout, p.stderr)
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and want in err[0], (cmd[0], err)
        assert not (tmp_path / "o.jsonl").exists()


def set_problem(path: Path) -> list[tuple[str, int, str]]:
    """The problems of a trace set of one folder holding ``path`` (named .jsonl: sets read those)."""
    folder = path.parent / "set"
    folder.mkdir(exist_ok=True)
    (folder / "run.jsonl").write_bytes(path.read_bytes())
    (folder / "good.jsonl").write_bytes(SAMPLE.read_bytes())
    ts = TraceSet.open_set(str(folder), final=True)
    assert len(ts) == 1  # the good file's trace
    return [(Path(f).name, ln, why) for f, ln, why in ts.problem_rows()]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_document_cut_short_is_one_problem_at_its_end(tmp_path, ui_ctx, suffix):
    data = LOGTREE.read_bytes()
    for k, at in enumerate(cut_points()):
        cut = data[:at]
        p = tmp_path / f"cut{k}{suffix}"
        p.write_bytes(cut)
        line, col = end_of(cut)
        want = f"the JSON document ends early at line {line}, column {col}: truncated?"
        if k in (0, 5, 11):  # every entry point on a few, the readers on all
            one_problem_everywhere(p, want, line, ui_ctx, tmp_path)
        else:
            for res in (load_traces(str(p)), load_any(str(p), import_foreign=True)):
                assert not res.traces and [(x.line, x.reason) for x in res.problems] == [(line, want)], (at, res.problems[:3])


def test_a_document_cut_short_in_a_trace_set_is_one_problem(tmp_path):
    data = LOGTREE.read_bytes()
    at = len(data) // 2
    p = tmp_path / "cut.json"
    p.write_bytes(data[:at])
    line, col = end_of(data[:at])
    rows = set_problem(p)
    assert len(rows) == 1 and rows[0][0] == "run.jsonl", rows
    assert f"the JSON document ends early at line {line}, column {col}: truncated?" in rows[0][2]


def test_a_syntax_error_in_the_middle_is_one_problem_where_json_stops(tmp_path, ui_ctx):
    lines = LOGTREE.read_text(encoding="utf-8").split("\n")
    k = next(i for i in range(len(lines) // 2, len(lines)) if '": "' in lines[i])
    lines[k] = lines[k].replace('": "', '" "', 1)  # a colon left out
    text = "\n".join(lines)
    with pytest.raises(json.JSONDecodeError) as ei:
        json.loads(text)
    e = ei.value
    assert e.lineno == k + 1  # where the edit was
    p = tmp_path / "broken.jsonl"
    p.write_text(text, encoding="utf-8")
    want = f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
    one_problem_everywhere(p, want, e.lineno, ui_ctx, tmp_path)
    rows = set_problem(p)
    assert len(rows) == 1 and want in rows[0][2], rows
    # a second document after the first: json's "Extra data"
    q = tmp_path / "two.json"
    one = LOGTREE.read_bytes().rstrip(b"\n") + b"\n"
    q.write_bytes(one + one)
    res = load_any(str(q), import_foreign=True)
    assert not res.traces
    second = one.count(b"\n") + 1  # the line the second document starts on
    assert [(x.line, x.reason) for x in res.problems] == [(second, f"invalid JSON at line {second}, column 1: Extra data")]


def test_tinkers_html_page_is_one_problem_naming_its_json_twin(tmp_path, ui_ctx):
    for name in ("train.html", "train.json", "train.jsonl"):
        p = tmp_path / name
        p.write_bytes(TRAIN_HTML.read_bytes())
        want = (f"{name} is an HTML document, not a trace file: tinker-cookbook's logtree page; "
                "read train_logtree.json, written beside it")
        one_problem_everywhere(p, want, 1, ui_ctx, tmp_path)
    assert set_problem(tmp_path / "train.jsonl") == [("run.jsonl", 0, want.replace("train.jsonl", "run.jsonl"))]


@pytest.mark.parametrize(("data", "what"), [
    (b"\n<!DOCTYPE html>\n<html>\n<head><title>x</title></head>\n<body>\n<p>hi</p>\n</body>\n</html>\n", "an HTML document"),
    (b'<?xml version="1.0" encoding="UTF-8"?>\n<feed>\n<entry>1</entry>\n</feed>\n', "an XML document"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'>\n<rect/>\n</svg>\n", "markup (HTML or XML)"),
])
def test_markup_is_one_problem_saying_what_it_looks_like(tmp_path, data, what):
    p = tmp_path / "page.jsonl"
    p.write_bytes(data)
    for res in (load_traces(str(p)), load_any(str(p), import_foreign=True)):
        assert not res.traces
        assert [(x.line, x.reason) for x in res.problems] == [(1, f"page.jsonl is {what}, not a trace file")]


def test_binary_bytes_are_refused_with_one_line(tmp_path, ui_ctx):
    rng = random.Random(7)
    junk = bytes(rng.randrange(1, 256) for _ in range(60_000))  # no NUL byte
    junk = b"\x89" + junk if junk[:1] in (b"{", b"[") else junk
    gz = gzip.compress(SAMPLE.read_bytes() * 20, mtime=1_700_000_000)
    for name, data in (("junk.jsonl", junk), ("log.jsonl.gz", gz), ("png.json", b"\x89PNG\r\n\x1a\n" + junk)):
        p = tmp_path / name
        p.write_bytes(data)
        for fn in (lambda: load_traces(str(p)), lambda: load_any(str(p)), lambda: TraceIndex.build([str(p)])):
            with pytest.raises(TraceFileError) as ei:
                fn()
            assert str(ei.value) == f"{name} looks like a binary file, not JSON/JSONL text"
        _, status, probs = ui_load(ui_ctx, p)
        assert "Could not read" in status and "binary" in status and probs.empty
        c = run_cli("check", str(p), "--no-tokens")
        assert c.returncode == 2 and c.stderr.strip() == f"error: {name} looks like a binary file, not JSON/JSONL text"


def test_jsonl_with_bad_lines_keeps_its_per_line_problems(tmp_path):
    """A JSONL file whose first line (and a few others) are bad: not taken for a document."""
    good = [ln for ln in SAMPLE.read_bytes().splitlines() if ln.strip()]
    assert len(good) == 1
    rows = [good[0][: len(good[0]) // 2], good[0], b'{"format_version": 1, "id": ', good[0], b"[1, 2", good[0], b"}"]
    for suffix in (".jsonl", ".json"):
        p = tmp_path / f"bad{suffix}"
        p.write_bytes(b"\n".join(rows) + b"\n")
        for res in (load_traces(str(p)), load_any(str(p))):
            assert res.lines == [2, 4, 6], (suffix, res.problems)
            assert [x.line for x in res.problems] == [1, 3, 5, 7]
            assert all("ends early" not in x.reason for x in res.problems)
    # two bad lines first, then good ones
    p = tmp_path / "two_bad.jsonl"
    p.write_bytes(b"\n".join([b"{", b'{"a": ', *[good[0]] * 3]) + b"\n")
    res = load_traces(str(p))
    assert res.lines == [3, 4, 5] and [x.line for x in res.problems] == [1, 2]


def test_jsonl_whose_records_are_longer_than_the_head_is_read_per_line(tmp_path):
    """A truncated first record followed by records each longer than the 64 KiB head (a prime-rl
    token export's are): the head shows no whole line after the first, which must not make the
    file a document (it did in CI: the verifiers import lost its one good record to a single
    "invalid JSON" problem). One line alone is one bad record, named by its line."""
    good = json.loads(SAMPLE.read_bytes().splitlines()[0])
    good["metadata"] = {**good.get("metadata", {}), "pad": "x" * (70 << 10)}
    line = json.dumps(good).encode()
    assert len(line) > 64 << 10
    p = tmp_path / "long.jsonl"
    p.write_bytes(b"\n".join([line[: len(line) // 3], line, line]) + b"\n")
    res = load_traces(str(p))
    assert res.lines == [2, 3] and [x.line for x in res.problems] == [1], res.problems
    one = tmp_path / "one.jsonl"
    one.write_bytes(b'{"id": "x", bad\n')
    assert [(x.line, "ends early" in x.reason) for x in load_traces(str(one)).problems] == [(1, False)]


def test_a_whole_pretty_printed_document_loads_under_any_name(tmp_path):
    """Decided from the content: the logtree, pretty-printed, named .jsonl, is one document."""
    p = tmp_path / "train_logtree.jsonl"
    p.write_bytes(LOGTREE.read_bytes())
    want = load_any(str(LOGTREE), import_foreign=True)
    got = load_any(str(p), import_foreign=True)
    assert not got.problems and want.traces and [t.id for t in got.traces] == [t.id for t in want.traces]
