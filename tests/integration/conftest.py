"""The one lab of the test session, and the offline artifacts site.yml needs on a lab host (a cached step).

`lab up` runs once per session (fixture `lab`) and `lab down` at its end, followed by the check that nothing of the
lab is left running, mounted or in the cgroup tree. test_lab.py, test_roles_nvidia.py and test_ladder_lab.py share
it. What a test needs of the lab is the fixture it asks for, and that also orders the tests (file order within
each step; see pytest_collection_modifyitems):

1. `fresh_lab`: the hosts as `lab up` made them - nothing converged, nothing rebooted (the `lab up` checks, the
   `--check --diff` of a fresh host, then test_roles_nvidia.py converging lab-3080 itself and counting reboots).
2. `lab`: any running lab.
3. `converged_lab`: site.yml has converged both hosts (run once, its result kept for the tests).
4. `lab_last`: the test takes the lab down itself, after every other test that uses it.
5. `no_lab`: no lab may be running (takes the session's lab down first if it is still up); `four_hosts`,
   `exporter_box` and
   `adopted_pair`: a lab of its own, in its own state directory (the session's lab taken down first).
"""

from __future__ import annotations

import os

import pytest
from helpers.cli import provision
from helpers.lab_host import leftovers

from rigbook.lab import artifacts, state

# The step of each fixture, the most particular first: fresh_lab, converged_lab and lab_last all ask for `lab`.
STEPS = (("no_lab", 5), ("four_hosts", 5), ("exporter_box", 5), ("adopted_pair", 5), ("seed_004_box", 5),
         ("lab_last", 4), ("converged_lab", 3), ("fresh_lab", 1), ("lab", 2))


def _step(item) -> int | None:
    """The step of the lab fixture ITEM asks for (None: it does not use the lab)."""
    names = getattr(item, "fixturenames", ())
    return next((step for name, step in STEPS if name in names), None)


# Lab groups: scripts/test runs each group's lab tests in a pytest process of its own, side by side, each with its
# own state directory and address block (RIGBOOK_TEST_LAB_GROUP, RIGBOOK_LAB_ADDRESS_BLOCK), so no two tests ever
# touch one lab at once. A test asking for `no_lab`, `four_hosts` or `exporter_box` brings up labs of its own ("own");
# the adopt tests
# (`adopted_pair`, `seed_004_box`) bring up their own labs, one after the other, in a process of their own ("adopt",
# beside "own"); the
# files of CONVERGED start from a converged session lab of their own; the NVIDIA role tests converge lab-3080 on a lab
# of their own ("nvidia"); every other lab test (the lab's own checks, the AMD role tests, the faults of a run on the
# AMD host) shares the session's lab in block 0 ("amd"). Without RIGBOOK_TEST_LAB_GROUP every lab test runs, on one
# lab, in step order.
LAB_GROUPS = ("amd", "nvidia", "converged", "own", "adopt")
CONVERGED = {"test_serving_lab.py", "test_ladder_lab.py", "test_rccl_lab.py", "test_output_lab.py",
             "test_adopt_converged_lab.py"}
NVIDIA = {"test_roles_nvidia.py"}


def lab_group(item) -> str | None:
    """The lab group of ITEM (None: it uses no lab)."""
    if _step(item) is None:
        return None
    names = set(getattr(item, "fixturenames", ()))
    if {"adopted_pair", "seed_004_box"} & names:
        return "adopt"
    if {"no_lab", "four_hosts", "exporter_box"} & names:
        return "own"
    if item.path.name in CONVERGED:
        return "converged"
    return "nvidia" if item.path.name in NVIDIA else "amd"


def _deselect_other_groups(config, items) -> None:
    group = os.environ.get("RIGBOOK_TEST_LAB_GROUP", "").strip()
    if not group:
        return
    if group not in LAB_GROUPS:
        raise pytest.UsageError(f"RIGBOOK_TEST_LAB_GROUP={group!r}: not one of {', '.join(LAB_GROUPS)}")
    kept = [item for item in items if lab_group(item) in (None, group)]
    gone = [item for item in items if lab_group(item) not in (None, group)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = kept


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Only this process's lab group (RIGBOOK_TEST_LAB_GROUP), then the tests that use the lab together, where the
    first of them stood, in step order (file order within a step); every other test keeps its place."""
    _deselect_other_groups(config, items)
    places = [i for i, item in enumerate(items) if _step(item) is not None]
    if not places:
        return
    ordered = [items[i] for i in sorted(places, key=lambda i: (_step(items[i]), i))]
    rest = [item for i, item in enumerate(items) if _step(item) is None]
    items[:] = rest[:places[0]] + ordered + rest[places[0]:]


def take_down():
    """`lab down` if this session's lab is up (a test may have taken it down already); then nothing may be left."""
    if state.state_file().exists():
        down = provision("lab", "down")
        assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers() == []


@pytest.fixture(scope="session")
def lab_artifacts():
    """The driver stand-ins packed (sha256 as pinned) and the CUDA wheels downloaded once, as `lab up` does.

    Everything lands in /var/cache/rigbook/artifacts, which the lab mounts read-only on each host; only the
    first run on a machine downloads the wheels.
    """
    artifacts.prepare()
    return artifacts.lab_pins()


@pytest.fixture(scope="session")
def lab():
    """`provision lab up` once for the session (lab-3080 and lab-r9700); yields what it printed.

    At the end of the session: `lab down` (unless a test took the lab down already), then nothing of the lab
    may be left.
    """
    assert not leftovers(), leftovers()
    proc = provision("lab", "up", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield proc.stdout
    take_down()


@pytest.fixture(scope="session")
def fresh_lab(lab):
    """The lab before any test converged or rebooted a host: tests asking for it run first."""
    return lab


@pytest.fixture(scope="session")
def converged_lab(lab, lab_artifacts):
    """The README's main job: `site.yml -i lab` on both hosts (lab-3080 gets its pinned kernel, the driver build
    and the CUDA toolchain, and reboots once, unless test_roles_nvidia.py converged it already); run once, its
    completed `provision` process kept for the tests."""
    proc = provision("site.yml", "-i", "lab", "--json", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture
def lab_last(lab):
    """The lab, for a test that takes it down: it runs after every other test that uses the lab."""
    return lab


@pytest.fixture
def no_lab():
    """No lab running in this session's state directory: takes the session's lab down first if it is still up."""
    take_down()


@pytest.fixture(scope="module")
def adopted_pair(tmp_path_factory):
    """Two fresh x99-3080 lab hosts (lab-3080, to be set up by hand, and lab-3080-2, its twin to be) for
    tests/integration/test_adopt_lab.py, up once for that module in a state directory of its own; yields that state
    directory's generated inventory. The session's lab is taken down first."""
    yield from _own_lab(tmp_path_factory, "adopted-pair", ["--hosts", "2", "--rig", "x99-3080"])


@pytest.fixture(scope="module")
def seed_004_box(tmp_path_factory):
    """Two fresh x99-r9700 lab hosts (lab-r9700, to be set up by hand as seed 004's owner did, and lab-r9700-2, its
    twin to be) for tests/integration/test_adopt_seed_004_lab.py, in a state directory of its own (after the adopt
    pair's lab is down: the same lab group); yields that state directory's generated inventory."""
    yield from _own_lab(tmp_path_factory, "seed-004", ["--hosts", "2", "--rig", "x99-r9700"])


def _own_lab(tmp_path_factory, name: str, up_args: list):
    """`lab up UP_ARGS` in a state directory of its own for one module; yields the generated inventory's path and
    takes the lab down (nothing left) at the end."""
    take_down()
    before = os.environ.get("RIGBOOK_STATE_DIR")
    os.environ["RIGBOOK_STATE_DIR"] = str(tmp_path_factory.mktemp(name) / "state")
    try:
        up = provision("lab", "up", *up_args, timeout=900)
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            generated = state.lab_dir() / "inventory"
            assert f"-i {generated}" in up.stdout, up.stdout
            yield str(generated)
        finally:
            down = provision("lab", "down")
            assert down.returncode == 0, down.stdout + down.stderr
            assert leftovers() == []
    finally:
        if before is None:
            os.environ.pop("RIGBOOK_STATE_DIR", None)
        else:
            os.environ["RIGBOOK_STATE_DIR"] = before


@pytest.fixture(scope="module")
def exporter_box(tmp_path_factory):
    """One fresh x99-r9700 lab host (lab-r9700) for tests/integration/test_health_exporter_lab.py, up once for that
    module in a state directory of its own; yields the generated inventory's path."""
    yield from _own_lab(tmp_path_factory, "exporter-box", ["--hosts", "1", "--rig", "x99-r9700"])


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory):
    """Four lab hosts, two of each vendor (lab-3080, lab-r9700, lab-3080-2 started bare, lab-r9700-2) for
    tests/integration/test_four_hosts_lab.py, up once for that module in a state directory of its own; yields the
    generated inventory's path. The session's lab is taken down first (it may hold the same addresses when one
    process runs every test)."""
    yield from _own_lab(tmp_path_factory, "four-hosts", ["--hosts", "4", "--rig", "x99-3080", "x99-r9700",
                                                         "x99-3080", "x99-r9700", "--bare", "lab-3080-2"])
