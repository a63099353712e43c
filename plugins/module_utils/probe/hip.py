# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer-access and copy-bandwidth probe for AMD GPUs through HIP (libamdhip64.so, ctypes; stdlib only).

NOT YET RUN ON REAL AMD HARDWARE. Written from the HIP API reference and headers (signatures,
error codes, the hipIpcMemLazyEnablePeerAccess flag that is 0x01 in current HIP and 0 in old
releases); its pure parts and its calls against a fake library are unit-tested
(tests/unit/plugins/module_utils/probe/test_hip_probe.py). The first run on an R9700/7900 box
should be checked by hand against TransferBench before its figures are trusted as a baseline.

Same contract and result as probe/cuda.py's probe() (the measurement engine, probe/engine.py, is
shared), with "api": "hip" and, per ordered pair, an inter-process check the write-up's
acceptance order asks for (seed 004, step 5 "HIP IPC" before TransferBench):

    "ipc": {"ok": true|false|null, "error": ..., "mode": "dma-buf"|"legacy"|"default"}

The parent allocates on GPU i, writes the pair's pattern, exports a hipIpcMemHandle; a second
process (`python3 -c`, never a fork of a HIP process) sets GPU j, opens the handle, copies the
peer memory into a local buffer on GPU j, reads it back and returns its SHA-256, which must match
the pattern's. HSA_ENABLE_IPC_MODE_LEGACY is taken from `ipc_legacy` (True -> "1", False -> "0",
None -> inherited) for the parent and the child: ROCR reads it when the library initialises, so
set it through this parameter in a fresh process (probe_isolated does) rather than after HIP
was loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import runner
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import engine

ProbeError = engine.ProbeError
DEFAULT_DEADLINE_S = 20.0  # each IPC check starts a Python and initialises HIP (~1-2 s)
IPC_ENV = "HSA_ENABLE_IPC_MODE_LEGACY"
IPC_LAZY_ENABLE_PEER_ACCESS = 0x01  # hipIpcMemLazyEnablePeerAccess; HIP before 5.x defined it as 0
IPC_HANDLE_SIZE = 64
HIP_MEMCPY_HOST_TO_DEVICE = 1
HIP_MEMCPY_DEVICE_TO_HOST = 2
HIP_STREAM_NON_BLOCKING = 0x01

# hipError_t (hip_runtime_api.h / hip/driver_types.h)
HIP_ERRORS = {
    0: "hipSuccess",
    1: "hipErrorInvalidValue",
    2: "hipErrorOutOfMemory",
    3: "hipErrorNotInitialized",
    4: "hipErrorDeinitialized",
    17: "hipErrorInvalidDevicePointer",
    21: "hipErrorInvalidMemcpyDirection",
    35: "hipErrorInsufficientDriver",
    100: "hipErrorNoDevice",
    101: "hipErrorInvalidDevice",
    201: "hipErrorInvalidContext",
    205: "hipErrorMapFailed",
    217: "hipErrorPeerAccessUnsupported",
    400: "hipErrorInvalidHandle",
    600: "hipErrorNotReady",
    700: "hipErrorIllegalAddress",
    704: "hipErrorPeerAccessAlreadyEnabled",
    705: "hipErrorPeerAccessNotEnabled",
    719: "hipErrorLaunchFailure",
    801: "hipErrorNotSupported",
    999: "hipErrorUnknown",
    1052: "hipErrorRuntimeMemory",
    1053: "hipErrorRuntimeOther",
}


def error_name(code):
    return engine.error_name(code, HIP_ERRORS, prefix="hipError")


def hip_version_text(version):
    """HIP_VERSION encoding major*10000000 + minor*100000 + patch: 70051831 -> '7.0.51831'."""
    if not version:
        return None
    return "%d.%d.%d" % (version // 10000000, (version // 100000) % 100, version % 100000)


def ipc_env(base, ipc_legacy):
    """The environment for HIP with HSA_ENABLE_IPC_MODE_LEGACY as asked (None keeps BASE's)."""
    env = dict(base)
    if ipc_legacy is not None:
        env[IPC_ENV] = "1" if ipc_legacy else "0"
    return env


def ipc_mode(env):
    value = env.get(IPC_ENV)
    if value is None:
        return "default"
    return "dma-buf" if value == "0" else "legacy"


def ipc_result(returncode, stdout, want_digest, mode, timed_out=False):
    """The pair's "ipc" entry from the child's exit status and JSON line."""
    out = {"ok": None, "error": None, "mode": mode}
    if timed_out:
        out.update(ok=False, error="the IPC child did not finish in time")
        return out
    try:
        reply = json.loads((stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        out["error"] = "the IPC child exited %s without a result" % returncode
        return out
    if reply.get("error"):
        out.update(ok=False, error=reply["error"])
    elif reply.get("sha256") != want_digest:
        out.update(ok=False, error="the peer's memory read through the IPC handle differs from the pattern")
    else:
        out["ok"] = True
    return out


# The second process: opens the parent's handle on GPU j and hashes what it reads there.
IPC_CHILD = r"""
import ctypes, hashlib, json, sys
lib_name, dev, handle_hex, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = {"error": None, "sha256": None}
class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
try:
    lib = ctypes.CDLL(lib_name)
    vp, sz, P = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER
    for fname, args in (("hipSetDevice", [ctypes.c_int]), ("hipMalloc", [P(vp), sz]), ("hipFree", [vp]),
                        ("hipMemcpy", [vp, vp, sz, ctypes.c_int]), ("hipDeviceSynchronize", []),
                        ("hipIpcOpenMemHandle", [P(vp), Handle, ctypes.c_uint]), ("hipIpcCloseMemHandle", [vp])):
        getattr(lib, fname).argtypes = args
        getattr(lib, fname).restype = ctypes.c_int
    lib.hipGetErrorName.argtypes, lib.hipGetErrorName.restype = [ctypes.c_int], ctypes.c_char_p
    def call(fname, *args):
        code = getattr(lib, fname)(*args)
        if code:
            raise RuntimeError("%s: %s" % (fname, (lib.hipGetErrorName(code) or b"?").decode()))
    call("hipSetDevice", dev)
    handle = Handle()
    ctypes.memmove(ctypes.addressof(handle), bytes.fromhex(handle_hex), 64)
    peer = vp()
    code = lib.hipIpcOpenMemHandle(ctypes.byref(peer), handle, 1)
    if code == 1:  # hipErrorInvalidValue: a HIP whose lazy-enable flag is 0
        code = lib.hipIpcOpenMemHandle(ctypes.byref(peer), handle, 0)
    if code:
        raise RuntimeError("hipIpcOpenMemHandle: %s" % (lib.hipGetErrorName(code) or b"?").decode())
    try:
        local = vp()
        call("hipMalloc", ctypes.byref(local), size)
        try:
            call("hipMemcpy", local, peer, size, 3)
            host = ctypes.create_string_buffer(size)
            call("hipMemcpy", host, local, size, 2)
            call("hipDeviceSynchronize")
            out["sha256"] = hashlib.sha256(host.raw[:size]).hexdigest()
        finally:
            lib.hipFree(local)
    finally:
        lib.hipIpcCloseMemHandle(peer)
except Exception as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""

_vp, _sz, _int, _uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint
_P = ctypes.POINTER


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


HIP_SYMBOLS = {
    "hipInit": (("hipInit",), [_uint]),
    "hipDriverGetVersion": (("hipDriverGetVersion",), [_P(_int)]),
    "hipGetDeviceCount": (("hipGetDeviceCount",), [_P(_int)]),
    "hipDeviceGet": (("hipDeviceGet",), [_P(_int), _int]),
    "hipDeviceGetName": (("hipDeviceGetName",), [ctypes.c_char_p, _int, _int]),
    "hipDeviceGetPCIBusId": (("hipDeviceGetPCIBusId",), [ctypes.c_char_p, _int, _int]),
    "hipSetDevice": (("hipSetDevice",), [_int]),
    "hipDeviceSynchronize": (("hipDeviceSynchronize",), []),
    "hipDeviceCanAccessPeer": (("hipDeviceCanAccessPeer",), [_P(_int), _int, _int]),
    "hipDeviceEnablePeerAccess": (("hipDeviceEnablePeerAccess",), [_int, _uint]),
    "hipDeviceDisablePeerAccess": (("hipDeviceDisablePeerAccess",), [_int]),
    "hipMalloc": (("hipMalloc",), [_P(_vp), _sz]),
    "hipFree": (("hipFree",), [_vp]),
    "hipHostMalloc": (("hipHostMalloc", "hipHostAlloc"), [_P(_vp), _sz, _uint]),
    "hipHostFree": (("hipHostFree", "hipFreeHost"), [_vp]),
    "hipMemcpy": (("hipMemcpy",), [_vp, _vp, _sz, _int]),
    "hipMemcpyAsync": (("hipMemcpyAsync",), [_vp, _vp, _sz, _int, _vp]),
    "hipMemcpyPeer": (("hipMemcpyPeer",), [_vp, _int, _vp, _int, _sz]),
    "hipMemcpyPeerAsync": (("hipMemcpyPeerAsync",), [_vp, _int, _vp, _int, _sz, _vp]),
    "hipMemset": (("hipMemset",), [_vp, _int, _sz]),
    "hipStreamCreateWithFlags": (("hipStreamCreateWithFlags",), [_P(_vp), _uint]),
    "hipStreamDestroy": (("hipStreamDestroy",), [_vp]),
    "hipStreamWaitEvent": (("hipStreamWaitEvent",), [_vp, _vp, _uint]),
    "hipEventCreate": (("hipEventCreate",), [_P(_vp)]),
    "hipEventRecord": (("hipEventRecord",), [_vp, _vp]),
    "hipEventSynchronize": (("hipEventSynchronize",), [_vp]),
    "hipEventElapsedTime": (("hipEventElapsedTime",), [_P(ctypes.c_float), _vp, _vp]),
    "hipEventDestroy": (("hipEventDestroy",), [_vp]),
    "hipIpcGetMemHandle": (("hipIpcGetMemHandle",), [_P(IpcHandle), _vp]),
}


def run_child(argv, env, timeout):
    """(returncode, stdout, timed_out) of the IPC child, run through facts/runner.run with exactly ENV (clean_env)."""
    result = runner.run(argv, timeout=timeout, env=env, clean_env=True)
    if result.timed_out:
        return None, "", True
    if result.rc is None:
        return None, json.dumps({"error": "cannot start the IPC child: %s" % result.error}), False
    return result.rc, result.stdout, False


class HipBackend:
    """HIP behind the engine's backend interface (see probe/engine.py)."""

    api = "hip"
    errors_table = HIP_ERRORS

    def __init__(self, library="libamdhip64.so", lib=None, ipc=True, ipc_legacy=None, python=None, child_runner=None):
        self.library = library  # the name (what the IPC child loads)
        self.lib = lib  # an already loaded handle, else loaded by open()
        self.ipc = ipc
        self.ipc_legacy = ipc_legacy
        self.python = python or sys.executable or "python3"
        self.child_runner = child_runner or run_child
        self.fn = None
        self.ordinal = {}

    def name(self, code):
        if code in HIP_ERRORS or self.fn is None:
            return error_name(code)
        try:
            text = self.lib.hipGetErrorName(code)
        except Exception:
            text = None
        return text.decode(errors="replace") if isinstance(text, bytes) else error_name(code)

    def call(self, name, *args):
        code = self.fn[name](*args)
        if code != 0:
            raise ProbeError(name, code, self.name(code))

    def open(self):
        if self.lib is None:
            self.lib = ctypes.CDLL(self.library)
        self.fn = engine.bind(self.lib, HIP_SYMBOLS)
        try:
            self.lib.hipGetErrorName.argtypes = [_int]
            self.lib.hipGetErrorName.restype = ctypes.c_char_p
        except AttributeError:
            pass
        self.call("hipInit", 0)
        version = ctypes.c_int(0)
        self.call("hipDriverGetVersion", ctypes.byref(version))
        count = ctypes.c_int(0)
        self.call("hipGetDeviceCount", ctypes.byref(count))
        found = []
        for ordinal in range(count.value):
            dev = ctypes.c_int(0)
            self.call("hipDeviceGet", ctypes.byref(dev), ordinal)
            name = ctypes.create_string_buffer(256)
            self.call("hipDeviceGetName", name, 256, dev.value)
            bus = ctypes.create_string_buffer(64)
            self.call("hipDeviceGetPCIBusId", bus, 64, ordinal)
            found.append(
                {
                    "ordinal": ordinal,
                    "name": name.value.decode(errors="replace"),
                    "pci_bus_id": engine.normalize_bus_id(bus.value.decode(errors="replace")),
                }
            )
        devices = engine.order_devices(found)
        self.ordinal = {d["index"]: d["ordinal"] for d in devices}
        return {
            "library": self.library,
            "driver_version": version.value,
            "driver": hip_version_text(version.value),
            "devices": devices,
        }

    def close(self):
        self.ordinal = {}

    def set_device(self, dev):
        self.call("hipSetDevice", self.ordinal[dev])

    def alloc(self, dev, n):
        self.set_device(dev)
        ptr = _vp()
        self.call("hipMalloc", ctypes.byref(ptr), n)
        return ptr.value

    def free(self, dev, ptr):
        self.set_device(dev)
        self.call("hipFree", ptr)

    def host_alloc(self, n):
        ptr = _vp()
        self.call("hipHostMalloc", ctypes.byref(ptr), n, 0)
        return ptr.value

    def host_free(self, ptr):
        self.call("hipHostFree", ptr)

    def stream(self, dev):
        self.set_device(dev)
        s = _vp()
        self.call("hipStreamCreateWithFlags", ctypes.byref(s), HIP_STREAM_NON_BLOCKING)
        return s.value

    def stream_destroy(self, dev, s):
        self.set_device(dev)
        self.call("hipStreamDestroy", s)

    def event(self, dev):
        self.set_device(dev)
        e = _vp()
        self.call("hipEventCreate", ctypes.byref(e))
        return e.value

    def event_destroy(self, dev, e):
        self.set_device(dev)
        self.call("hipEventDestroy", e)

    def record(self, dev, e, s):
        self.set_device(dev)
        self.call("hipEventRecord", e, s)

    def wait(self, dev, s, e):
        self.set_device(dev)
        self.call("hipStreamWaitEvent", s, e, 0)

    def event_sync(self, dev, e):
        self.call("hipEventSynchronize", e)

    def elapsed_ms(self, dev, a, b):
        ms = ctypes.c_float(0.0)
        self.call("hipEventElapsedTime", ctypes.byref(ms), a, b)
        return ms.value

    def h2d_async(self, dev, dptr, hptr, n, s):
        self.set_device(dev)
        self.call("hipMemcpyAsync", dptr, hptr, n, HIP_MEMCPY_HOST_TO_DEVICE, s)

    def d2h_async(self, dev, hptr, dptr, n, s):
        self.set_device(dev)
        self.call("hipMemcpyAsync", hptr, dptr, n, HIP_MEMCPY_DEVICE_TO_HOST, s)

    def h2d(self, dev, dptr, hptr, n):
        self.set_device(dev)
        self.call("hipMemcpy", dptr, hptr, n, HIP_MEMCPY_HOST_TO_DEVICE)
        self.call("hipDeviceSynchronize")

    def d2h(self, dev, hptr, dptr, n):
        self.set_device(dev)
        self.call("hipMemcpy", hptr, dptr, n, HIP_MEMCPY_DEVICE_TO_HOST)

    def memset0(self, dev, dptr, n):
        self.set_device(dev)
        self.call("hipMemset", dptr, 0, n)
        self.call("hipDeviceSynchronize")

    def sync(self, dev):
        self.set_device(dev)
        self.call("hipDeviceSynchronize")

    def peer(self, dst_dev, dptr_dst, src_dev, dptr_src, n):
        self.set_device(src_dev)
        self.call("hipMemcpyPeer", dptr_dst, self.ordinal[dst_dev], dptr_src, self.ordinal[src_dev], n)
        self.call("hipDeviceSynchronize")
        self.sync(dst_dev)

    def peer_async(self, dst_dev, dptr_dst, src_dev, dptr_src, n, s):
        self.set_device(src_dev)
        self.call("hipMemcpyPeerAsync", dptr_dst, self.ordinal[dst_dev], dptr_src, self.ordinal[src_dev], n, s)

    def can_access(self, i, j):
        value = ctypes.c_int(0)
        self.call("hipDeviceCanAccessPeer", ctypes.byref(value), self.ordinal[i], self.ordinal[j])
        return value.value == 1

    def enable_peer(self, i, j):
        self.set_device(i)
        return self.fn["hipDeviceEnablePeerAccess"](self.ordinal[j], 0)

    def disable_peer(self, i, j):
        self.set_device(i)
        self.call("hipDeviceDisablePeerAccess", self.ordinal[j])

    def pair_extra(self, i, j, src_ptr, want, seconds_left):
        """The IPC check of pair (I, J): GPU I's buffer opened and read in another process on GPU J."""
        env = ipc_env(os.environ, self.ipc_legacy)
        mode = ipc_mode(env)
        if not self.ipc:
            return {}
        if seconds_left < 3:
            return {"ipc": {"ok": None, "error": "skipped: deadline", "mode": mode}}
        handle = IpcHandle()
        try:
            self.set_device(i)
            self.call("hipIpcGetMemHandle", ctypes.byref(handle), src_ptr)
        except ProbeError as exc:
            return {"ipc": {"ok": False, "error": str(exc), "mode": mode}}
        raw = ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_SIZE)  # not .reserved: it stops at a NUL
        argv = [self.python, "-c", IPC_CHILD, self.library, str(self.ordinal[j]), raw.hex(), str(len(want))]
        returncode, stdout, timed_out = self.child_runner(argv, env, seconds_left)
        return {"ipc": ipc_result(returncode, stdout, hashlib.sha256(want).hexdigest(), mode, timed_out)}


def probe(size_bytes=engine.DEFAULT_SIZE, reps=engine.DEFAULT_REPS, deadline_s=DEFAULT_DEADLINE_S, pairs=None,
          ipc=True, ipc_legacy=None, library=None):
    """Probe every GPU pair through HIP; the engine's result shape plus "ipc" per pair. Never raises.

    IPC_LEGACY sets HSA_ENABLE_IPC_MODE_LEGACY for this process (before HIP loads) and the IPC child.
    """
    name = library or "libamdhip64.so"
    previous = os.environ.get(IPC_ENV)
    try:
        if ipc_legacy is not None:
            os.environ[IPC_ENV] = "1" if ipc_legacy else "0"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            if library:
                return engine.unavailable("hip", "cannot load %s: %s" % (name, exc), library=name)
            try:  # /opt/rocm/lib may not be on the loader path
                name = "/opt/rocm/lib/libamdhip64.so"
                lib = ctypes.CDLL(name)
            except OSError:
                return engine.unavailable("hip", "cannot load libamdhip64.so: %s" % exc, library="libamdhip64.so")
        backend = HipBackend(name, lib=lib, ipc=ipc, ipc_legacy=ipc_legacy)
        return engine.measure(backend, size_bytes, reps, deadline_s, pairs)
    finally:
        if previous is None:
            os.environ.pop(IPC_ENV, None)
        else:
            os.environ[IPC_ENV] = previous


def probe_isolated(size_bytes=engine.DEFAULT_SIZE, reps=engine.DEFAULT_REPS, deadline_s=DEFAULT_DEADLINE_S,
                   pairs=None, ipc=True, ipc_legacy=None, grace_s=30):
    """probe() in a forked child (fresh HIP state, IPC mode honoured), killed after DEADLINE_S + GRACE_S."""
    return engine.run_isolated(probe, deadline_s + grace_s, api="hip", size_bytes=size_bytes, reps=reps,
                               deadline_s=deadline_s, pairs=pairs, ipc=ipc, ipc_legacy=ipc_legacy)
