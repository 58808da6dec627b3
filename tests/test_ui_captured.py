"""The Captured sessions view's pieces (ui/captured.py) and when app.py's gateway may serve
(ui/gateway.py), without a browser: the tree under each parent, markup escaped, the session
listing limited to the folder's own names, and the gateway refused in public mode without a key."""

from __future__ import annotations

import json

from backend.trace import Trace
from ui import captured, gateway
from ui.context import AppContext, ModelService


def branch(bid: str, parent: str | None = None, cause: str | None = None, detail: str | None = None) -> dict:
    meta = {"source": "gateway", "branch": {"id": bid, "parent": parent, "fork_at": 3 if parent else None, "cause": cause}}
    if detail:
        meta["branch"]["detail"] = detail
    return {"format_version": 1, "id": f"t-{bid}", "prompt_ids": [1, 2, 3, 4], "metadata": meta,
            "steps": [{"index": 0, "state": "pending", "start": 0, "end": 4}], "termination_reason": "no_tool_calls"}


def write(folder, name: str, rows: list[dict]) -> None:
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_tree_puts_each_fork_under_its_parent_with_its_cause(tmp_path):
    write(tmp_path, "s1", [branch("b0"), branch("b1", "b0", "tools_changed"), branch("b2", "b1", "message_edited", "x<y")])
    tree, rows = captured.show(str(tmp_path), "s1")
    assert list(rows["branch"]) == ["b0", "b1", "b2"] and list(rows["cause"]) == ["", "tools_changed", "message_edited"]
    assert tree.index('data-branch="b0"') < tree.index('data-branch="b1"') < tree.index('data-branch="b2"')
    assert tree.count("<ul>") == 2  # b1 nested under b0, b2 under b1
    assert "the tool list changed" in tree and "x&lt;y" in tree


def test_markup_from_a_file_is_escaped(tmp_path):
    img = '<img src=x onerror="alert(1)">'
    write(tmp_path, "s2", [branch("b0" + img), branch("b1", "b0" + img, "message_edited" + img, img)])
    tree, _ = captured.show(str(tmp_path), "s2")
    assert "<img" not in tree and "&lt;img" in tree


def test_only_the_folders_own_sessions_are_shown(tmp_path):
    write(tmp_path, "ok-1", [branch("b0")])
    (tmp_path / "not a session.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("x")
    assert captured.sessions(str(tmp_path)) == ["ok-1"]
    for name in ("../ok-1", "not a session", "missing", None, ""):
        tree, rows = captured.show(str(tmp_path), name)
        assert rows.empty and "Choose a captured session" in tree


def test_a_bad_line_is_said_and_the_good_ones_shown(tmp_path):
    (tmp_path / "s3.jsonl").write_text(json.dumps(branch("b0")) + "\n{not json\n")
    tree, rows = captured.show(str(tmp_path), "s3")
    assert list(rows["branch"]) == ["b0"] and "line 2" in tree
    assert Trace.from_dict(branch("b0")).id == "t-b0"


def test_the_gateway_is_off_in_public_mode_without_a_key():
    from backend.safety.trust import Mode, TrustPolicy

    public = AppContext(trust=TrustPolicy(Mode.PUBLIC, "test"), default_script=["hi"])
    assert "no --gateway-key" in gateway.refusal(public, None, public_address=False)
    assert gateway.refusal(public, "k", public_address=False) is None
    local = AppContext(default_script=["hi"])
    assert "no --gateway-key" in gateway.refusal(local, None, public_address=True)  # --share, a public address
    assert gateway.refusal(local, None, public_address=False) is None
    assert "no model" in gateway.refusal(AppContext(model=ModelService(None)), None, public_address=False)
