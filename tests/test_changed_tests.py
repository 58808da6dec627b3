"""``scripts/changed_tests.py`` (``bash scripts/test.sh --changed``): which test files a change
reaches, read from the real tree's imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import changed_tests  # noqa: E402


def _picked(*changed: str) -> list[str]:
    return changed_tests.select(list(changed))[0]


def test_a_module_picks_the_tests_that_reach_it_and_not_the_others():
    picked = _picked("backend/checks/seqdiff.py")
    assert "tests/test_seqdiff.py" in picked
    assert "tests/test_layout.py" not in picked and "tests/test_changed_tests.py" not in picked


def test_a_module_named_in_a_table_counts_as_imported():
    """The parsers are imported by name from PARSER_MODULES: a parser's change reaches its tests."""
    picked = _picked("backend/parsers/glm45.py")
    assert "tests/test_parser_deepseek_glm.py" in picked and "tests/test_layout.py" not in picked


def test_a_test_helper_reaches_the_tests_that_import_it():
    picked = _picked("tests/verl_oracle.py")
    assert "tests/test_continuous_verl.py" in picked and "tests/test_seqdiff.py" not in picked


def test_a_doc_picks_the_doc_checks_and_the_tests_that_name_it():
    picked = _picked("docs/limits.md")
    assert "tests/test_docs.py" in picked and "tests/test_seqdiff.py" not in picked and len(picked) <= 3, picked


def test_a_template_inside_the_product_reaches_its_readers():
    picked = _picked("backend/templates/smollm2_tools.jinja")
    assert "tests/test_families.py" in picked and "tests/test_seqdiff.py" not in picked


def test_what_every_test_depends_on_picks_everything():
    for rel in ("tests/conftest.py", "requirements.txt", "pytest.ini", "backend/gone_module.py"):
        assert _picked(rel) == ["tests"], rel


def test_the_command_lists_existing_files():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "changed_tests.py"), "--base", "HEAD"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert all((ROOT / p).exists() for p in out), out
