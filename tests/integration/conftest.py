"""Shared by the lab tests: the offline artifacts site.yml needs on a lab host (a cached step)."""

from __future__ import annotations

import pytest

from rigbook.lab import artifacts


@pytest.fixture(scope="session")
def lab_artifacts():
    """The driver stand-ins packed (sha256 as pinned) and the CUDA wheels downloaded once, as `lab up` does.

    Everything lands in /var/cache/rigbook/artifacts, which the lab mounts read-only on each host; only the
    first run on a machine downloads the wheels.
    """
    artifacts.prepare()
    return artifacts.lab_pins()
