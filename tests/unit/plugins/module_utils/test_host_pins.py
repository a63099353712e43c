"""plugins/module_utils/host_pins.py: the one table of pins. Every pin of the table round-trips: what `provision adopt`
reads on a box (its inverse, from adopt_facts' facts) is a pin whose forward (host_model.build) holds every value adopt
wrote; the table is the host model's pins, in order; each comment adopt writes names a value it wrote."""

from __future__ import annotations

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model, host_pins

RELEASE = "6.8.12-r9700-p2p-dma44"
KERNEL_DEBS = {"release": RELEASE, "cmdline": ["iommu=pt", "amd_iommu=on"], "packages": [
    {"name": f"linux-image-{RELEASE}", "version": "6.8.12-1", "origin": "local",
     "sources": ["100 /var/lib/dpkg/status"], "deb": {"path": "/root/kernel-debs/image.deb", "sha256": "a" * 64}},
    {"name": f"linux-headers-{RELEASE}", "version": "6.8.12-1", "origin": "local",
     "sources": ["100 /var/lib/dpkg/status"], "deb": {"path": "/root/kernel-debs/headers.deb", "sha256": "b" * 64}}]}
KERNEL_DISTRO = {"release": "6.1.0-47-amd64", "cmdline": ["intel_iommu=on", "iommu=pt"], "packages": [
    {"name": "linux-image-6.1.0-47-amd64", "version": "6.1.170-3", "origin": "archive",
     "sources": ["500 http://deb.debian.org/debian bookworm/main amd64 Packages"]},
    {"name": "linux-headers-6.1.0-47-amd64", "version": "6.1.170-3", "origin": "archive",
     "sources": ["500 http://deb.debian.org/debian bookworm/main amd64 Packages"]}]}
DKMS = [{"module": "nvidia", "version": "615.71.09", "kernels": {"6.1.0-47-amd64": "installed"},
         "source": "/usr/src/nvidia-615.71.09",
         "git": {"repo": "https://github.com/tinygrad/open-gpu-kernel-modules", "branch": "p2p", "commit": "3f2b1c0a"}}]
FOLDER = "/srv/wheels/cuda-13.0.88"


def _wheels(*pairs, folder=None):
    return [{"name": name, "version": version, "install": "index",
             "wheels": [{"path": f"{folder}/{name}-{version}.whl", "sha256": "f" * 64}] if folder else []}
            for name, version in pairs]


CUDA_13 = _wheels(("nvidia-cuda-cccl", "13.0.85"), ("nvidia-cuda-crt", "13.0.88"), ("nvidia-cuda-nvcc", "13.0.88"),
                  ("nvidia-cuda-runtime", "13.0.88"), ("nvidia-nccl-cu13", "2.27.7"), ("nvidia-nvvm", "13.0.88"),
                  folder=FOLDER)
CUDA_MIXED = _wheels(("nvidia-cuda-crt", "13.0.88"), ("nvidia-cuda-nvcc", "13.0.88"),
                     ("nvidia-cuda-runtime", "13.0.96"), ("nvidia-nvvm", "13.0.88"))
ROCM = {"version_file": "7.1.0-38",
        "packages": {"rocm-core": "7.1.0.70100-38~24.04", "rocminfo": "1.0.0.70100-38~24.04",
                     "rocm-smi-lib": "7.8.0.70100-38~24.04", "hip-runtime-amd": "7.1.25424.70100-38~24.04",
                     "hipcc": "1.1.1.70100-38~24.04", "amdgpu-dkms": "6.16.6.70100-38~24.04"},
        "manual": ["hip-runtime-amd", "rocm-core", "rocm-smi-lib", "rocminfo", "hipcc"],
        "policy": ["500 https://repo.radeon.com/rocm/apt/7.1 noble/main amd64 Packages", "100 /var/lib/dpkg/status"],
        "sources": [{"file": "/etc/apt/sources.list.d/rocm.list", "types": ["deb"],
                     "uris": ["https://repo.radeon.com/rocm/apt/7.1"], "suites": ["noble"], "components": ["main"],
                     "signed_by": ["/etc/apt/keyrings/rocm.gpg"]}],
        "keyrings": {"/etc/apt/keyrings/rocm.gpg": "c" * 64}}
RCCL_STAMP = {"name": "rccl", "version": "2.27.7", "components": [
    {"name": "rccl", "source": "dir:https://github.com/ROCm/rocm-systems@" + "1" * 40, "subdir": "projects/rccl",
     "patches": ["p2p-level-user-last.patch -p2 " + "d" * 64],
     "cmake_args": ["-DROCM_PATH=/opt/rocm", "-DGPU_TARGETS=gfx1201"]},
    {"name": "rccl-tests", "source": "dir:https://github.com/ROCm/rccl-tests@" + "2" * 40, "subdir": "",
     "patches": [], "cmake_args": []}]}


def _engine(**fields):
    engine = {"pid": 4100, "unit": "sglang.service", "venv": "/srv/sgl", "args": ["--model-path", "/m"], "env": {},
              "packages": []}
    engine.update(fields)
    return engine


# What adopt_facts reads on a box, for each pin of the table (a new pin needs its own here). A sample is a whole box's
# facts: a pin's forward may depend on another's (nvidia_driver's uvm_disable_hmm on the kernel's iommu=pt).
SAMPLES = {
    "kernel": [{"kernel": KERNEL_DEBS}, {"kernel": KERNEL_DISTRO}],
    "nvidia_driver": [{"kernel": KERNEL_DISTRO, "dkms": DKMS, "nvidia_userspace": "615.71.09",
                       "uvm_disable_hmm": True}],
    "cuda_toolchain": [{"dkms": DKMS, "cuda_venv": {"venv": host_pins.CUDA_VENV, "packages": CUDA_13}},
                       {"engines": [_engine(packages=CUDA_MIXED)]}],
    "nccl_tests": [{"dkms": DKMS, "cuda_venv": {"venv": host_pins.CUDA_VENV, "packages": CUDA_13}}],
    "rocm": [{"rocm": ROCM, "engines": [_engine(env={"HSA_ENABLE_IPC_MODE_LEGACY": "0", "HSA_XNACK": "0"})]},
             {"rocm": dict(ROCM, manual=["rocm-core"], version_file=None, sources=[])}],
    "rccl": [{"engines": [_engine(libraries=[{"path": "/opt/rigbook/rccl/2.27.7-5d2f/lib/librccl.so.1.0",
                                              "sha256": "f" * 64, "build": {
                                                  "path": "/opt/rigbook/rccl/2.27.7-5d2f/.rigbook-build.json",
                                                  "stamp": RCCL_STAMP}}])]}],
    "sglang": [{"engines": [_engine(packages=[{"name": "sglang", "version": "0.5.23", "install": "index"}],
                                    venv_stamp={"patches": ["fix.patch -p1 " + "e" * 64], "no_deps": True,
                                                "no_index": True, "find_links": ["/srv/wheels/sglang"],
                                                "byte_compile": False})]}],
}
# Pins adopt cannot read on a box (no process shows them): never written, the reason always said.
NOT_READ = {"nccl_tests"}
# Where the forward keeps a value adopt wrote under another name (a dict there holds at least what adopt wrote).
MODEL_OF = {
    ("cuda_toolchain", "versions"): lambda pin: pin["wanted"],
    ("rocm", "hsa_env"): lambda pin: pin["env"],
    ("rccl", "tests"): lambda pin: {"source": pin["tests_source"]},
}


def _carried(wrote, model):
    """MODEL holds WROTE: equal, or for a dict every key of WROTE carried into MODEL's."""
    if isinstance(wrote, dict):
        return isinstance(model, dict) and all(k in model and _carried(v, model[k]) for k, v in wrote.items())
    return wrote == model


def _at(value, path):
    for step in path:
        value = value[step]
    return value


def test_the_table_is_the_host_models_pins_in_order_each_with_a_sample():
    names = [pin.name for pin in host_pins.PINS]
    assert list(host_model.build({})["pins"]) == names
    assert sorted(SAMPLES) == sorted(names), "each pin of host_pins.PINS needs facts adopt reads for it here"
    assert all(pin.key == "rigbook_pins." + pin.name for pin in host_pins.PINS)
    # unpinned, each is the forward's defaults: nothing adopt reads on a box without it
    assert not any(pin["pinned"] for pin in host_model.build({})["pins"].values())
    assert host_pins.read_pins({}).pins == {}


@pytest.mark.parametrize("name,facts", [(name, facts) for name, samples in SAMPLES.items() for facts in samples],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_every_pin_round_trips(name, facts):
    reading = host_pins.read_pins(facts)
    model = host_model.build({"rigbook_pins": reading.pins})["pins"]
    if name in NOT_READ:
        assert name not in reading.pins and not model[name]["pinned"]
        assert any(text.startswith(host_pins.BY_NAME[name].key) for text in reading.unpinned)
        return
    wrote = reading.pins[name]
    assert wrote and model[name]["pinned"]
    for key, value in wrote.items():
        held = MODEL_OF.get((name, key), lambda pin, key=key: pin[key])(model[name])
        assert _carried(value, held), (name, key, value, held)
    # the pin's own inverse, from the same facts and the pins before it, writes the same pin
    before = host_pins.Reading()
    for pin in host_pins.PINS[:[p.name for p in host_pins.PINS].index(name)]:
        found = pin.inverse(facts, before)
        if found:
            before.pins[pin.name] = found
    assert host_pins.BY_NAME[name].inverse(facts, before) == wrote


@pytest.mark.parametrize("facts", [facts for samples in SAMPLES.values() for facts in samples])
def test_each_comment_says_where_a_value_adopt_wrote_was_read(facts):
    reading = host_pins.read_pins(facts)
    for path, where in reading.comments.items():
        assert path[0] == "rigbook_pins" and where
        _at(reading.pins, path[1:])  # the value the comment stands beside exists


def test_the_venv_stamps_install_options_come_back_as_the_sglang_pin():
    (facts,) = SAMPLES["sglang"]
    pin = host_pins.read_pins(facts).pins["sglang"]
    assert (pin["no_deps"], pin["wheel_dir"], pin["byte_compile"]) == (True, "/srv/wheels/sglang", False)
