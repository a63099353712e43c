"""pinned_venv, in-process with real commands: a real venv, real pip (offline, from a wheel made here), real
`patch`. The wheel is a tiny package built by the test (a wheel is a zip with a dist-info); nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import pinned_venv
from helpers.modules import run_module_real

SOURCE = "def gather(enabled):\n    return enabled\n"
PATCH = """--- a/demo/core.py
+++ b/demo/core.py
@@ -1,2 +1,3 @@
 def gather(enabled):
-    return enabled
+    # patched: never on this box
+    return False
"""


def make_wheel(dest: Path, version: str, source: str = SOURCE, extra=None) -> Path:
    files = {"demo/__init__.py": f"__version__ = {version!r}\n", "demo/core.py": source, **(extra or {}),
             f"demo-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n\n",
             f"demo-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"demo-{version}.dist-info/RECORD,,")
    files[f"demo-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"demo-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    dest = tmp_path_factory.mktemp("wheels")
    make_wheel(dest, "1.0")
    make_wheel(dest, "2.0", source="def gather(enabled):\n    return bool(enabled)\n")
    # a wheel that bundles a library, as torch's ROCm wheel carries torch/lib/librccl.so.1
    make_wheel(dest, "2.5", extra={"demo/lib/librccl.so.1": "the wheel's stock copy"})
    return dest


def venvs_left(tmp_path: Path) -> list:
    """What is under the venv root besides the pip logs."""
    return sorted(p.name for p in (tmp_path / "venvs").iterdir() if not p.name.endswith(".pip.log"))


def patch_file(tmp_path: Path, text: str = PATCH) -> dict:
    path = tmp_path / "off.patch"
    path.write_text(text)
    return {"path": str(path), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def args(tmp_path, wheels, version="1.0", patches=(), **extra):
    return dict(dict(path=str(tmp_path / "venvs" / f"demo-{version}-{{patch_set}}"),
                     requirements=[f"demo=={version}"], no_index=True, find_links=[str(wheels)],
                     expect={"demo": version}, patches=list(patches),
                     import_check="import demo.core as c; print(c.gather(True))"), **extra)


def test_install_patch_then_a_converged_rerun_runs_nothing(tmp_path, wheels):
    patch = patch_file(tmp_path)
    a = args(tmp_path, wheels, patches=[patch], byte_compile=False)
    result, failed, ran = run_module_real(pinned_venv, a)
    assert not failed, result
    pip = [argv for argv in ran if "pip" in argv and "install" in argv]
    assert len(pip) == 1 and "--no-compile" in pip[0], ran  # byte_compile off: pip writes no bytecode
    venv = Path(result["path"])
    assert venv.name == "demo-1.0-" + hashlib.sha256(f"off.patch:{patch['sha256']}".encode()).hexdigest()[:12]
    assert result["changed"] and result["versions"] == {"demo": "1.0"} and result["patches_applied"] == ["off.patch"]
    assert result["import_output"] == "False"  # the patched code ran
    assert [argv[:2] for argv in ran if argv[0] == "patch"] == [["patch", "--dry-run"], ["patch", "-p1"]]
    stamp = json.loads((venv / ".rigbook-venv.json").read_text())
    assert list(stamp["files"]) == ["demo/core.py"] and stamp["byte_compile"] is False  # recorded for adopt
    again, failed, ran = run_module_real(pinned_venv, a)
    assert not failed and not again["changed"] and again["reasons"] == [] and ran == []  # one check, no command


def test_a_hand_edit_of_a_patched_file_is_repaired(tmp_path, wheels):
    a = args(tmp_path, wheels, patches=[patch_file(tmp_path)])
    result, _, ran = run_module_real(pinned_venv, a)
    assert [argv for argv in ran if "pip" in argv and "install" in argv and "--no-compile" not in argv]  # pip's default
    core = next(Path(result["path"]).glob("lib/python*/site-packages/demo/core.py"))
    core.write_text(SOURCE)  # e.g. a pip install --force-reinstall by hand
    check, failed, ran = run_module_real(pinned_venv, a, check_mode=True)
    assert not failed and check["changed"] and ran == []
    assert check["reasons"] == [f"{core} changed since it was patched"]
    fixed, failed, _ = run_module_real(pinned_venv, a)
    assert not failed and fixed["changed"] and "return False" in core.read_text()


def test_a_patch_that_no_longer_applies_names_itself_and_the_file_and_leaves_no_venv(tmp_path, wheels):
    a = args(tmp_path, wheels, version="2.0", patches=[patch_file(tmp_path)])
    result, failed, _ = run_module_real(pinned_venv, a)
    assert failed
    assert "patch off.patch no longer applies to demo==2.0" in result["msg"], result["msg"]
    assert "failed on demo/core.py" in result["msg"] and result["failing_files"] == ["demo/core.py"]
    assert venvs_left(tmp_path) == []  # the venv made by this call was removed (its pip log stays)


def test_bad_patch_sha256_is_refused_before_anything_is_made(tmp_path, wheels):
    patch = dict(patch_file(tmp_path), sha256="0" * 64)
    result, failed, ran = run_module_real(pinned_venv, args(tmp_path, wheels, patches=[patch]))
    assert failed and "refused patch" in result["msg"] and "0" * 64 in result["msg"]
    assert ran == [] and not (tmp_path / "venvs").exists()


def test_a_version_pip_cannot_find_fails_with_pips_words_and_leaves_no_venv(tmp_path, wheels):
    result, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, version="3.0"))
    assert failed and "pip install into" in result["msg"] and "demo==3.0" in result["msg"]
    assert venvs_left(tmp_path) == []


def test_lock_file_is_installed_and_its_change_remakes_the_venv(tmp_path, wheels):
    lock = tmp_path / "lock.txt"
    digest = hashlib.sha256((wheels / "demo-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    lock.write_text(f"demo==1.0 --hash=sha256:{digest}\n")
    a = args(tmp_path, wheels, lock=str(lock), requirements=[], import_check="")
    a["requirements"] = ["demo==1.0"]
    result, failed, _ = run_module_real(pinned_venv, a)
    assert not failed and result["changed"], result
    lock.write_text(f"demo==1.0 --hash=sha256:{'1' * 64}\n")  # a lock whose hash the wheel does not match
    check, failed, _ = run_module_real(pinned_venv, a, check_mode=True)
    assert check["changed"] and check["reasons"] == ["the stamp differs in lock_sha256"]
    bad, failed, _ = run_module_real(pinned_venv, a)
    assert failed and "HASH" in bad["msg"].upper()


def test_a_branch_is_not_a_commit(tmp_path, wheels):
    result, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, expect_commit={"demo": "main"}))
    assert failed and "a branch is not a pin" in result["msg"]


def test_a_wheel_install_is_not_the_pinned_commit(tmp_path, wheels):
    result, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, expect_commit={"demo": "4cb5aebfe"}))
    assert failed and "demo was installed from commit (none: not a VCS install), pinned 4cb5aebfe" in result["msg"]


def venv_by_hand(tmp_path, wheels, version="1.0") -> Path:
    """`python3 -m venv` and `pip install` by hand, as a box's owner did before rigbook (no stamp)."""
    import subprocess
    import sys

    venv = tmp_path / "by-hand"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(wheels), f"demo=={version}"], check=True)
    (venv / "owner-notes.txt").write_text("mine\n")
    return venv


def test_a_venv_made_by_hand_that_holds_the_pin_is_kept_and_only_stamped(tmp_path, wheels):
    venv = venv_by_hand(tmp_path, wheels)
    lock = tmp_path / "lock.txt"
    lock.write_text("# adopted\ndemo==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    a = args(tmp_path, wheels, path=str(venv), adopt=True, lock=str(lock), import_check="")
    check, failed, ran = run_module_real(pinned_venv, a, check_mode=True)
    assert not failed and check["changed"] and check["adopted"] and ran == []
    assert check["reasons"] == [f"{venv} was made by hand and holds the pin: stamped, nothing installed"]
    assert not (venv / ".rigbook-venv.json").exists()
    done, failed, ran = run_module_real(pinned_venv, a)
    assert not failed and done["adopted"] and ran == []  # no pip, no venv made
    assert json.loads((venv / ".rigbook-venv.json").read_text())["versions"] == {"demo": "1.0"}
    again, failed, ran = run_module_real(pinned_venv, a)
    assert not failed and not again["changed"] and not again["adopted"] and ran == []
    assert (venv / "owner-notes.txt").exists()


@pytest.mark.parametrize("hand", ["owned by another user", "site-packages owned by another user",
                                  "writable by others", "a link"])
def test_a_venv_another_user_can_write_is_refused_and_nothing_is_run_or_written(tmp_path, wheels, hand):
    """A venv made by hand as another user (then adopted): its python would run as root here. Refused before any
    command runs, no stamp written, the venv as it was."""
    import os

    venv = tmp_path / "by-hand"  # the folders the module looks at; it must refuse before it runs anything in them
    site = venv / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "owner-notes.txt").write_text("mine\n")
    if hand == "owned by another user":
        os.chown(venv, 4242, 4242)
    elif hand == "site-packages owned by another user":
        os.chown(site, 4242, 4242)
    elif hand == "writable by others":
        (venv / "bin").chmod(0o777)
    else:
        os.rename(venv, tmp_path / "real-venv")
        os.symlink(tmp_path / "real-venv", venv)
    a = args(tmp_path, wheels, path=str(venv), adopt=True, import_check="")
    for check_mode in (True, False):
        res, failed, ran = run_module_real(pinned_venv, a, check_mode=check_mode)
        assert failed and ran == [], res
        assert res["msg"].startswith(f"refused the venv {venv}: ") and "nothing was changed" in res["msg"]
    assert not (venv / ".rigbook-venv.json").exists() and (venv / "owner-notes.txt").exists()


def test_a_venv_made_by_hand_at_another_version_is_installed_into_never_removed(tmp_path, wheels):
    venv = venv_by_hand(tmp_path, wheels, "1.0")
    a = args(tmp_path, wheels, version="2.0", path=str(venv), adopt=True, import_check="")
    check, failed, _ = run_module_real(pinned_venv, a, check_mode=True)
    assert not failed and check["changed"] and not check["adopted"]
    assert check["reasons"] == [f"{venv} was made by hand: demo is 1.0, pinned 2.0; pip installs into it"]
    done, failed, ran = run_module_real(pinned_venv, a)
    assert not failed, done
    assert done["versions"] == {"demo": "2.0"} and (venv / "owner-notes.txt").exists()
    assert not any(argv[1:3] == ["-m", "venv"] for argv in ran)
    assert json.loads((venv / ".rigbook-venv.json").read_text())["versions"] == {"demo": "2.0"}


def test_a_bundled_library_is_linked_to_the_verified_one_after_every_venv_change(tmp_path, wheels):
    verified = tmp_path / "rccl/current/lib/librccl.so.1"
    verified.parent.mkdir(parents=True)
    verified.write_bytes(b"the patched build")
    libraries = [{"bundled": "demo/lib/librccl.so.1", "target": str(verified)}]
    plain, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, libraries=libraries))
    assert not failed and plain["linked"] == []  # no bundled copy in this venv: nothing to link, nothing made up
    # the venv made in this run from a wheel that bundles the library: linked in the same run
    a = args(tmp_path, wheels, version="2.5", libraries=libraries, import_check="")
    made, failed, _ = run_module_real(pinned_venv, a)
    site = next(Path(made["path"]).glob("lib/python*/site-packages"))
    bundled = site / "demo/lib/librccl.so.1"
    assert not failed and made["changed"] and made["linked"] == [str(bundled)]
    assert bundled.resolve() == verified and bundled.read_bytes() == b"the patched build"
    assert (site / "demo/lib/librccl.so.1.rigbook-bundled").read_text() == "the wheel's stock copy"
    again, failed, ran = run_module_real(pinned_venv, a)
    assert not failed and not again["changed"] and again["linked"] == [] and ran == []
    # put back by hand (a pip --force-reinstall of the wheel): check mode names it, the run relinks without pip
    bundled.unlink()
    bundled.write_text("the wheel's stock copy")
    check, failed, ran = run_module_real(pinned_venv, a, check_mode=True)
    assert not failed and check["changed"] and check["linked"] == [str(bundled)] and ran == []
    assert not bundled.is_symlink()  # check mode changed nothing
    fixed, failed, ran = run_module_real(pinned_venv, a)
    assert not failed and fixed["changed"] and fixed["reasons"] == [] and ran == []  # the links only: no pip
    assert bundled.resolve() == verified


def test_a_library_to_link_to_that_is_missing_or_a_bundled_path_outside_the_venv_is_refused(tmp_path, wheels):
    made, _, _ = run_module_real(pinned_venv, args(tmp_path, wheels))
    site = next(Path(made["path"]).glob("lib/python*/site-packages"))
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/lib/librccl.so.1").write_bytes(b"stock")
    missing = str(tmp_path / "no/librccl.so.1")
    result, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, libraries=[
        {"bundled": "torch/lib/librccl.so.1", "target": missing}]))
    assert failed and f"{missing}, is not there" in result["msg"]
    assert (site / "torch/lib/librccl.so.1").read_bytes() == b"stock"  # nothing half-done
    for bundled in ("../../../etc/passwd", "/etc/passwd"):
        result, failed, _ = run_module_real(pinned_venv, args(tmp_path, wheels, libraries=[
            {"bundled": bundled, "target": "/x"}]))
        assert failed and "no path inside site-packages" in result["msg"]
