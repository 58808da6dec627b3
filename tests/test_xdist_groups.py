"""The test workers' grouping (tests/conftest.py): under ``scripts/test.sh`` (``-n 2 --dist loadgroup``)
a test file runs on one worker, so its module fixtures (an app, a browser, a Space venv) are built
once. pytest-xdist 3.8.0 writes the group into the test's id, which pytest 9.2 no longer lets it do
(pytest-xdist#1386): every group was split over both workers, and the costliest module fixtures
were built twice, with nothing failing. requirements-dev.txt pins pytest 9.1.1 until that is fixed;
this test fails if the grouping is lost again."""

from __future__ import annotations

import os

import pytest

THIS_FILE = "tests/test_xdist_groups.py"


def test_this_file_is_one_group_and_a_worker_sees_it_in_the_test_id(request: pytest.FixtureRequest):
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == (THIS_FILE,), marker
    if os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup"):
        # what the scheduler reads: the group after the last "@" of the id the worker reports
        assert request.node.nodeid == f"{THIS_FILE}::{request.node.name}@{THIS_FILE}", request.node.nodeid
