"""Shared test setup: an isolated state directory, the collection on the import path, tests/ on sys.path.

Helpers shared by several test modules live in the package tests/helpers/, one module per job (`from helpers.cli
import provision`; tests/helpers/__init__.py lists them); fixtures in the conftest.py files. No test module imports
another.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = str(REPO / "tests")
if TESTS not in sys.path:  # `import helpers.cli` in any import mode (pytest's default prepend mode adds it too)
    sys.path.insert(0, TESTS)

# The whole test session gets its own state directory, so runs, links and lab state never
# touch the user's ~/.local/state/rigbook.
_SESSION_STATE = os.environ.get("RIGBOOK_TEST_STATE_DIR") or tempfile.mkdtemp(prefix="rigbook-test-state-")
os.environ["RIGBOOK_STATE_DIR"] = _SESSION_STATE

from rigbook.paths import link_collection  # noqa: E402

link_collection()  # puts ansible_collections.rigbook.homelab on sys.path


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def fixtures() -> Path:
    return REPO / "tests" / "fixtures"

