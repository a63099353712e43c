"""Shared test setup: an isolated state directory, the collection on the import path, tests/ on sys.path.

Helpers shared by several test modules live in tests/helpers.py (`import helpers`); fixtures in the conftest.py
files. No test module imports another.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = str(REPO / "tests")
if TESTS not in sys.path:  # `import helpers` in any import mode (pytest's default prepend mode adds it too)
    sys.path.insert(0, TESTS)

# The whole test session gets its own state directory, so runs, links and lab state never
# touch the user's ~/.local/state/rigbook.
# Under pytest-xdist each worker is a session of its own, with its own state directory.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("RIGBOOK_TEST_STATE_DIR"):
    _SESSION_STATE = os.path.join(os.environ["RIGBOOK_TEST_STATE_DIR"], _WORKER)
else:
    _SESSION_STATE = tempfile.mkdtemp(prefix=f"rigbook-test-state-{_WORKER}-" if _WORKER else "rigbook-test-state-")
os.makedirs(_SESSION_STATE, mode=0o700, exist_ok=True)
os.environ["RIGBOOK_STATE_DIR"] = _SESSION_STATE

from rigbook.paths import link_collection  # noqa: E402

link_collection()  # puts ansible_collections.rigbook.homelab on sys.path


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def fixtures() -> Path:
    return REPO / "tests" / "fixtures"


def pytest_collection_modifyitems(items):
    """Every test of the lab marker in one pytest-xdist group (`--dist loadgroup` runs a group on one worker, in
    collection order): the lab's hosts have fixed loopback addresses, so two lab tests may never run at once, while
    the unit, local, wheel, lint and browser tests run on the other workers beside the lab's reboots and waits."""
    for item in items:
        if item.get_closest_marker("lab"):
            item.add_marker(pytest.mark.xdist_group("lab"))
