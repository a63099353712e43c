"""Shared test setup: an isolated state directory and the collection on the import path."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The whole test session gets its own state directory, so runs, links and lab state never
# touch the user's ~/.local/state/rigbook.
_SESSION_STATE = os.environ.get("RIGBOOK_TEST_STATE_DIR") or tempfile.mkdtemp(prefix="rigbook-test-state-")
os.environ["RIGBOOK_STATE_DIR"] = _SESSION_STATE

from rigbook.paths import collections_path  # noqa: E402

collections_path()  # puts ansible_collections.rigbook.homelab on sys.path


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def fixtures() -> Path:
    return REPO / "tests" / "fixtures"
