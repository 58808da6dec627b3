"""The operator documentation keeps up with the code: every ``ALI_*`` variable the app reads is
documented (docs/space.md or docs/limits.md), every flag's variable is in the Space guide's
table, and every relative link in the README and docs/ names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def variables_read_by_the_app() -> set[str]:
    found: set[str] = set()
    for base in (ROOT / "backend", ROOT / "ui"):
        for f in base.rglob("*.py"):
            found |= set(re.findall(r"\bALI_[A-Z0-9_]+[A-Z0-9]\b", f.read_text()))
    found |= set(re.findall(r"\bALI_[A-Z0-9_]+[A-Z0-9]\b", (ROOT / "app.py").read_text()))
    return found


def test_every_variable_is_documented():
    documented = (DOCS / "space.md").read_text() + (DOCS / "limits.md").read_text()
    missing = sorted(v for v in variables_read_by_the_app() if v not in documented)
    assert not missing, f"undocumented variables: {missing}"


def test_every_flags_variable_is_in_the_space_guides_table():
    import app

    table = (DOCS / "space.md").read_text().split("## Every variable", 1)[1]
    missing = [var for _flags, var, *_ in app.OPTIONS if var and f"`{var}`" not in table]
    assert not missing, f"not in docs/space.md's table: {missing}"


def test_relative_links_resolve():
    broken = []
    for md in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)} → {target}")
    assert not broken, broken
