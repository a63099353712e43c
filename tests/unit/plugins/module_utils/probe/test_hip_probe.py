"""The HIP probe without AMD hardware: pure parts, and its calls driven against a fake libamdhip64.

The fake library implements the hip* functions the backend binds, in Python: device memory in
bytearrays, host memory in real ctypes buffers, IPC through a stand-in child runner. It checks
that every call the backend makes exists, takes the arguments in the documented order, and that
the shared engine sees the same result shape as with CUDA.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import types

from ansible_collections.rigbook.homelab.plugins.module_utils.probe import engine
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import hip as H

MIB = 1 << 20


def fake_hip(ngpu=2, enable_code=0, can_access=1, ipc_get_code=0):
    """A namespace of plain functions (bind() sets argtypes on them) mimicking libamdhip64."""
    state = {"dev": {}, "host": {}, "next": 0x10000, "current": 0, "live": set(), "ipc_handles": 0, "peer": set()}

    def out(ref, value):
        ref._obj.value = value

    def new(kind):
        state["next"] += 0x1000
        state["live"].add((kind, state["next"]))
        return state["next"]

    def gone(kind, handle):
        state["live"].remove((kind, handle))
        return 0

    def mem(ptr):
        return state["dev"][ptr]

    def copy(dst, src, n, kind):
        if kind == 1:  # host to device
            mem(dst)[:n] = ctypes.string_at(src, n)
        elif kind == 2:  # device to host
            ctypes.memmove(dst, bytes(mem(src)[:n]), n)
        else:
            mem(dst)[:n] = mem(src)[:n]
        return 0

    def malloc(ref, n):
        ptr = new("dev")
        state["dev"][ptr] = bytearray(n)
        out(ref, ptr)
        return 0

    def host_malloc(ref, n, flags):
        assert flags == 0
        buf = ctypes.create_string_buffer(n)
        state["host"][ctypes.addressof(buf)] = buf
        state["live"].add(("host", ctypes.addressof(buf)))
        out(ref, ctypes.addressof(buf))
        return 0

    def set_device(d):
        if not 0 <= d < ngpu:
            return 101
        state["current"] = d
        return 0

    def enable(peer, flags):
        assert flags == 0
        if enable_code == 0:
            state["peer"].add((state["current"], peer))
        return enable_code

    def disable(peer):
        state["peer"].remove((state["current"], peer))
        return 0

    def stream_create(ref, flags):
        assert flags == H.HIP_STREAM_NON_BLOCKING
        out(ref, new("stream"))
        return 0

    def event_create(ref):
        out(ref, new("event"))
        return 0

    def elapsed(ref, a, b):
        out(ref, 4.0)
        return 0

    def name_into(buf, length, dev):
        buf.value = b"AMD Radeon AI PRO R9700"
        return 0

    def bus_into(buf, length, dev):
        buf.value = b"0000:%02X:00.0" % (4 - dev)  # ordinal 0 sits on the higher bus
        return 0

    def ipc_get(ref, ptr):
        if ipc_get_code:
            return ipc_get_code
        assert ptr in state["dev"]
        ctypes.memmove(ctypes.addressof(ref._obj), b"\x00handle-with-a-leading-nul".ljust(64, b"\x01"), 64)
        state["ipc_handles"] += 1
        return 0

    lib = types.SimpleNamespace(
        hipInit=lambda flags: 0,
        hipDriverGetVersion=lambda ref: out(ref, 70051831) or 0,
        hipGetDeviceCount=lambda ref: out(ref, ngpu) or 0,
        hipDeviceGet=lambda ref, ordinal: out(ref, ordinal) or 0,
        hipDeviceGetName=name_into,
        hipDeviceGetPCIBusId=bus_into,
        hipSetDevice=set_device,
        hipDeviceSynchronize=lambda: 0,
        hipDeviceCanAccessPeer=lambda ref, a, b: out(ref, can_access if a != b else 0) or 0,
        hipDeviceEnablePeerAccess=enable,
        hipDeviceDisablePeerAccess=disable,
        hipMalloc=malloc,
        hipFree=lambda ptr: gone("dev", ptr),
        hipHostMalloc=host_malloc,
        hipHostFree=lambda ptr: gone("host", ptr),
        hipMemcpy=copy,
        hipMemcpyAsync=lambda dst, src, n, kind, s: copy(dst, src, n, kind),
        hipMemcpyPeer=lambda dst, dd, src, sd, n: copy(dst, src, n, 3),
        hipMemcpyPeerAsync=lambda dst, dd, src, sd, n, s: copy(dst, src, n, 3),
        hipMemset=lambda ptr, value, n: mem(ptr).__setitem__(slice(0, n), bytes([value]) * n) or 0,
        hipStreamCreateWithFlags=stream_create,
        hipStreamDestroy=lambda s: gone("stream", s),
        hipStreamWaitEvent=lambda s, e, flags: 0,
        hipEventCreate=event_create,
        hipEventRecord=lambda e, s: 0,
        hipEventSynchronize=lambda e: 0,
        hipEventElapsedTime=elapsed,
        hipEventDestroy=lambda e: gone("event", e),
        hipIpcGetMemHandle=ipc_get,
        hipGetErrorName=lambda code: H.HIP_ERRORS.get(code, "hipErrorUnknown").encode(),
    )
    return lib, state


def child_ok(seen):
    """A stand-in for the second process: answers with the digest of the buffer the parent exported."""

    def runner(argv, env, timeout):
        seen.append((argv, env, timeout))
        size = int(argv[-1])
        # opened on ordinal 0 = index 1 (ordinals run against bus order, see bus_into): pair 0 -> 1
        src, dst = (0, 1) if argv[4] == "0" else (1, 0)
        digest = hashlib.sha256(engine.pattern(engine.pair_seed(src, dst), size)).hexdigest()
        return 0, json.dumps({"error": None, "sha256": digest}) + "\n", False

    return runner


def run(backend, **kw):
    kw.setdefault("size_bytes", 1 * MIB)
    kw.setdefault("reps", 2)
    kw.setdefault("deadline_s", 30)
    result = engine.measure(backend, **kw)
    json.dumps(result)
    return result


# ------------------------------------------------------------------ pure parts


def test_error_names():
    assert H.error_name(217) == "hipErrorPeerAccessUnsupported"
    assert H.error_name(205) == "hipErrorMapFailed"
    assert H.error_name(4242) == "hipError_4242"
    assert engine.enable_result(704, H.HIP_ERRORS) == "already enabled"
    assert engine.enable_result(217, H.HIP_ERRORS) == "hipErrorPeerAccessUnsupported"


def test_hip_version_text():
    assert H.hip_version_text(70051831) == "7.0.51831"
    assert H.hip_version_text(60443484) == "6.4.43484"
    assert H.hip_version_text(0) is None


def test_ipc_environment_follows_the_parameter():
    base = {"PATH": "/usr/bin", H.IPC_ENV: "1"}
    assert H.ipc_env(base, False)[H.IPC_ENV] == "0"
    assert H.ipc_env(base, True)[H.IPC_ENV] == "1"
    assert H.ipc_env(base, None)[H.IPC_ENV] == "1" and base[H.IPC_ENV] == "1"
    assert H.ipc_mode({H.IPC_ENV: "0"}) == "dma-buf" and H.ipc_mode({H.IPC_ENV: "1"}) == "legacy"
    assert H.ipc_mode({}) == "default"


def test_ipc_result_shapes():
    want = hashlib.sha256(b"x").hexdigest()
    ok = H.ipc_result(0, json.dumps({"error": None, "sha256": want}), want, "dma-buf")
    assert ok == {"ok": True, "error": None, "mode": "dma-buf"}
    wrong = H.ipc_result(0, json.dumps({"error": None, "sha256": "0" * 64}), want, "dma-buf")
    assert wrong["ok"] is False and "differs" in wrong["error"]
    failed = H.ipc_result(0, json.dumps({"error": "hipIpcOpenMemHandle: hipErrorInvalidDevicePointer"}), want, "legacy")
    assert failed["ok"] is False and "hipErrorInvalidDevicePointer" in failed["error"]
    garbled = H.ipc_result(-11, "Segmentation fault", want, "default")
    assert garbled["ok"] is None and "-11" in garbled["error"]
    hung = H.ipc_result(None, "", want, "default", timed_out=True)
    assert hung["ok"] is False and "in time" in hung["error"]


def test_the_ipc_child_script_compiles():
    compile(H.IPC_CHILD, "<ipc child>", "exec")


def test_missing_library_is_unavailable_not_an_exception():
    result = H.probe(library="/nonexistent/libamdhip64.so")
    assert result["available"] is False and result["api"] == "hip" and "cannot load" in result["error"]


def test_probe_restores_the_ipc_environment(monkeypatch):
    monkeypatch.setenv(H.IPC_ENV, "1")
    H.probe(library="/nonexistent/libamdhip64.so", ipc_legacy=False)
    assert os.environ[H.IPC_ENV] == "1"


# ------------------------------------------------------------------ the backend against a fake library


def test_two_gpus_through_the_fake_library():
    lib, state = fake_hip()
    seen = []
    backend = H.HipBackend("libamdhip64.so", lib=lib, ipc_legacy=False, child_runner=child_ok(seen))
    result = run(backend)
    assert result["available"] is True and result["api"] == "hip" and result["driver"] == "7.0.51831"
    assert [(d["index"], d["ordinal"], d["pci_bus_id"]) for d in result["devices"]] == [
        (0, 1, "0000:03:00.0"), (1, 0, "0000:04:00.0")]
    for pair in result["pairs"]:
        assert pair["can_access_peer"] is True and pair["enable_peer"] == "ok"
        assert pair["pattern_ok"] is True and pair["staged_pattern_ok"] is True
        assert pair["peer_gbs"] == engine.gbs(2 * MIB, 4.0)
        assert pair["ipc"] == {"ok": True, "error": None, "mode": "dma-buf"}
    assert result["bidir"][0]["gbs"] == engine.gbs(4 * MIB, 4.0)
    assert state["live"] == set() and state["peer"] == set()  # every buffer, stream, event, peer mapping released
    assert len(seen) == 2 and state["ipc_handles"] == 2
    argv, env, timeout = seen[0]
    assert argv[1] == "-c" and argv[3] == "libamdhip64.so" and env[H.IPC_ENV] == "0" and timeout > 3
    assert len(bytes.fromhex(argv[5])) == 64 and argv[5].startswith("00")  # the whole handle, NUL bytes too


def test_ipc_child_reading_other_bytes_fails_the_pair():
    lib, _ = fake_hip()

    def wrong(argv, env, timeout):
        return 0, json.dumps({"error": None, "sha256": "0" * 64}), False

    result = run(H.HipBackend("libamdhip64.so", lib=lib, child_runner=wrong))
    assert all(p["ipc"]["ok"] is False for p in result["pairs"])


def test_export_failure_is_named():
    lib, state = fake_hip(ipc_get_code=1)
    result = run(H.HipBackend("libamdhip64.so", lib=lib, child_runner=child_ok([])))
    assert result["pairs"][0]["ipc"] == {"ok": False, "error": "hipIpcGetMemHandle: hipErrorInvalidValue",
                                         "mode": "default"}
    assert state["live"] == set()


def test_peer_access_refused_is_named_and_nothing_to_disable():
    lib, state = fake_hip(enable_code=217, can_access=0)
    result = run(H.HipBackend("libamdhip64.so", lib=lib, ipc=False))
    assert [p["enable_peer"] for p in result["pairs"]] == ["hipErrorPeerAccessUnsupported"] * 2
    assert [p["can_access_peer"] for p in result["pairs"]] == [False, False]
    assert all("ipc" not in p for p in result["pairs"])
    assert state["live"] == set()


def test_one_gpu():
    lib, state = fake_hip(ngpu=1)
    result = run(H.HipBackend("libamdhip64.so", lib=lib))
    assert result["pairs"] == [] and result["devices"][0]["h2d_gbs"]
    assert state["live"] == set()
