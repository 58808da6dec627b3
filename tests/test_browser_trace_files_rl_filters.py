"""The Trace files tab's GRPO group and reward filters on an uploaded file, and the group view's
link in the address, in headless Chromium (the real app, tests/test_browser.py's shared scripted
app); the same filters over gradio_client (/trace_files_upload, then /trace_files_filter).

The file is a TRL completion log (written by ``trl.GRPOTrainer``, tests/fixtures_gen/gen_trl.py):
what the filters keep is read here with pandas (a row's reward is the sum of its reward columns;
the rows of one prompt are one group, TRL names no group). An upload is its session's only: a
reload starts a new session, so the reloaded page shows the address's group once the same file is
uploaded again."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pandas as pd
from test_browser import _NAVIGATION_ABORT, ROOT, App, app, pytestmark  # noqa: F401 - fixtures, used by name

# a picker is covered by its loading overlay while the view's events run: on a loaded machine that
# may outlast playwright's default 30 s
SLOW_MS = 120_000
TRL = ROOT / "tests" / "data" / "import" / "trl" / "completions" / "completions_00001.parquet"


def _trl() -> pd.DataFrame:
    df = pd.read_parquet(TRL)
    return pd.DataFrame({"reward": df[["right_answer", "brevity"]].sum(axis=1),
                         "prompt": [json.dumps(list(p), default=str) for p in df["prompt"]]})


def _prompt_groups(df: pd.DataFrame) -> list[list[int]]:
    return sorted(sorted(int(i) for i in ix) for ix in df.groupby("prompt").groups.values())


def _query(page: App) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.js("window.location.href")).query)


def _table_rows(page: App, n: int) -> list[int]:
    page.page.wait_for_function(f"document.querySelectorAll('#tf-table [data-row][data-col=\"0\"]').length === {n}")
    return sorted(int(page.cell("tf-table", r, 0).inner_text()) for r in range(n))


def _upload(page: App) -> None:
    page.page.locator("#tf-upload input[type=file]").set_input_files(str(TRL))
    page.wait_text("#tf-status", "imported from trl")


def test_upload_filter_by_group_and_reward_pick_a_sample_and_reload(app):  # noqa: F811 - fixture
    rows = _trl()
    groups = _prompt_groups(rows)
    app.tab("Trace files")
    _upload(app)
    assert _table_rows(app, len(rows)) == list(range(len(rows)))
    # the group view: the second group picked; the address names it
    app.page.locator("#gv-section").get_by_text("GRPO groups", exact=False).first.click()
    app.wait_text("#gv-note", f"{len(groups)} group(s)")
    app.wait_text("#gv-aligned", "A: rank 1")
    app.page.locator("#gv-group input").click(timeout=SLOW_MS)
    second = app.page.get_by_role("option").nth(1)
    label = second.inner_text()
    second.click()
    app.wait_text("#gv-note", label.split(" · ")[1][:30])
    key = app.js("document.querySelector('#gv-note .gv-head').dataset.group")
    app.page.wait_for_function("(k) => new URL(window.location.href).searchParams.get('group') === k", arg=key)
    assert _query(app)["tab"] == ["files"]

    # the table's group filter: that key keeps the rows of one prompt; with reward > 0, those of them with a reward above 0
    box = app.page.locator("#tf-group").locator("textarea, input").first
    box.fill(key)
    box.press("Enter")
    kept = _table_rows(app, 2)
    assert kept in groups
    app.page.locator("#tf-reward input").click(timeout=SLOW_MS)
    app.page.get_by_role("option", name="reward > 0", exact=True).click()
    want = [i for i in kept if rows["reward"][i] > 0]
    assert want and _table_rows(app, len(want)) == want
    app.wait_text("#tf-count", f"{len(want)} of {len(rows)} shown")

    # pick sample A = rank 2 in the group view: the address names it
    app.page.locator("#gv-a input").click(timeout=SLOW_MS)
    app.page.get_by_role("option").filter(has_text="2 · ").first.click()
    aligned = app.wait_text("#gv-aligned", "A: rank 2")
    sample = aligned.split("A: rank 2 · ", 1)[1].split(" · ", 1)[0]
    app.page.wait_for_function("(t) => new URL(window.location.href).searchParams.get('trace') === t", arg=sample)
    q = _query(app)
    assert q["group"] == [key] and "step" not in q

    # reload: a new session (the samples); the address keeps the group and sample, and the same
    # file uploaded again opens on them
    app.page.reload()
    app.page.wait_for_selector("#tf-table", state="visible")
    app.wait_text("#gv-note", "not among these traces")
    assert _query(app)["group"] == [key] and _query(app)["trace"] == [sample]
    _upload(app)
    app.wait_text("#gv-note", f"group {key}")
    app.wait_text("#gv-aligned", f"A: rank 2 · {sample}")
    assert "B: rank 1" in app.text("#gv-aligned")
    q = _query(app)
    assert q["group"] == [key] and q["trace"] == [sample]
    app.errors[:] = [e for e in app.errors if not _NAVIGATION_ABORT.search(e)]  # the reload aborts the old page's requests
    app.assert_clean()


def test_the_filters_over_the_api(app_url, tmp_path):
    from gradio_client import Client, handle_file

    rows = _trl()
    c = Client(app_url, download_files=str(tmp_path), verbose=False)
    up = c.predict(handle_file(str(TRL)), api_name="/trace_files_upload")
    assert "imported from <b>trl</b>" in up[0], up[0]

    def kept(**kw) -> list[int]:
        out = c.predict(**kw, api_name="/trace_files_filter")
        table = out[2]
        return sorted(int(r[table["headers"].index("#")]) for r in table["data"] if str(r[0]).strip() != "")

    assert kept() == list(range(len(rows)))
    assert kept(reward="reward > 0") == sorted(int(i) for i in rows.index[rows["reward"] > 0])
    assert kept(reward="reward < 0") == sorted(int(i) for i in rows.index[rows["reward"] < 0])
    assert kept(step="1") == list(range(len(rows)))
    # the groups the group view shows (/trace_groups's picker): each keeps the rows of one prompt
    keys = [k for _, k in c.predict(api_name="/trace_groups")[2]["choices"]]
    assert sorted(kept(group=k) for k in keys) == _prompt_groups(rows)
    g = kept(group=keys[0], reward="reward > 0")
    assert g == [i for i in kept(group=keys[0]) if rows["reward"][i] > 0] and g
    assert kept(group="<script>alert(1)</script>") == []
