"""The suite's xdist groups hold: under ``--dist loadgroup`` (scripts/test.sh) each test carries its group, so a
file's tests share one worker and every Ray test shares one (tests/conftest.py). A test runner that drops the
groups (pytest 9.2 with pytest-xdist 3.8: constraints.txt pins the runner) fails here, where it would
otherwise run the Ray modules' clusters two at a time and the suite far past its budget."""

from __future__ import annotations

import pytest


def test_this_test_carries_its_files_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under --dist loadgroup, as scripts/test.sh runs the suite")
    assert request.node.nodeid.endswith(f"@{request.node.path.as_posix()}")
