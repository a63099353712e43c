# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peer-access and copy-bandwidth probe through the CUDA driver API (ctypes; standard library only).

Runs on the target with its system Python (3.8+). It needs libcuda.so.1 (the driver), not the
CUDA toolkit. `probe()` returns the evidence dict of the peer_access and p2p_bandwidth layers
described in probe/engine.py (the measurement engine, shared with probe/hip.py), with
"api": "cuda", "driver_version" as cuDriverGetVersion gives it (13000) and "driver" ("13.0").

enable_peer is "ok", "already enabled" or the CUresult name (seed 000's "mapping of buffer
object failed" is CUDA_ERROR_MAP_FAILED); seed 000's peer copy was no faster than the
host-staged one (6.0 GB/s both), which is how a copy that is not P2P shows.

`CudaBackend` is the driver API behind the engine's backend interface; `probe_isolated()` runs
`probe()` in a forked child with a hard timeout (engine.run_isolated).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json

from ansible_collections.rigbook.homelab.plugins.module_utils.probe import engine
from ansible_collections.rigbook.homelab.plugins.module_utils.probe.engine import (  # re-exported for callers
    DEFAULT_DEADLINE_S,
    DEFAULT_REPS,
    DEFAULT_SIZE,
)

ProbeError = engine.ProbeError

# CUresult codes the probe can meet (cuda.h, 13.0); cuGetErrorName answers for the others.
CU_ERRORS = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    205: "CUDA_ERROR_MAP_FAILED",
    206: "CUDA_ERROR_UNMAP_FAILED",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    400: "CUDA_ERROR_INVALID_HANDLE",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
    705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
    708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    711: "CUDA_ERROR_TOO_MANY_PEERS",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    800: "CUDA_ERROR_NOT_PERMITTED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    909: "CUDA_ERROR_TIMEOUT",
    999: "CUDA_ERROR_UNKNOWN",
}


def error_name(code):
    return engine.error_name(code, CU_ERRORS, prefix="CUDA_ERROR")


def driver_text(version):
    """13000 -> '13.0'; 12040 -> '12.4'."""
    if not version:
        return None
    return "%d.%d" % (version // 1000, (version % 1000) // 10)


# ---------------------------------------------------------------- the CUDA backend

_c_int_p = ctypes.POINTER(ctypes.c_int)
_vp = ctypes.c_void_p
_u64 = ctypes.c_uint64
_sz = ctypes.c_size_t
_uint = ctypes.c_uint
_int = ctypes.c_int
# exported symbol names (first found wins) and argument types; every call returns CUresult
CUDA_SYMBOLS = {
    "cuInit": (("cuInit",), [_uint]),
    "cuDriverGetVersion": (("cuDriverGetVersion",), [_c_int_p]),
    "cuDeviceGetCount": (("cuDeviceGetCount",), [_c_int_p]),
    "cuDeviceGet": (("cuDeviceGet",), [_c_int_p, _int]),
    "cuDeviceGetName": (("cuDeviceGetName",), [ctypes.c_char_p, _int, _int]),
    "cuDeviceGetPCIBusId": (("cuDeviceGetPCIBusId",), [ctypes.c_char_p, _int, _int]),
    "cuDeviceCanAccessPeer": (("cuDeviceCanAccessPeer",), [_c_int_p, _int, _int]),
    "cuDevicePrimaryCtxRetain": (("cuDevicePrimaryCtxRetain",), [ctypes.POINTER(_vp), _int]),
    "cuDevicePrimaryCtxRelease": (("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), [_int]),
    "cuCtxSetCurrent": (("cuCtxSetCurrent",), [_vp]),
    "cuCtxSynchronize": (("cuCtxSynchronize",), []),
    "cuCtxEnablePeerAccess": (("cuCtxEnablePeerAccess",), [_vp, _uint]),
    "cuCtxDisablePeerAccess": (("cuCtxDisablePeerAccess",), [_vp]),
    "cuMemAlloc": (("cuMemAlloc_v2",), [ctypes.POINTER(_u64), _sz]),
    "cuMemFree": (("cuMemFree_v2",), [_u64]),
    "cuMemAllocHost": (("cuMemAllocHost_v2",), [ctypes.POINTER(_vp), _sz]),
    "cuMemFreeHost": (("cuMemFreeHost",), [_vp]),
    "cuMemcpyHtoD": (("cuMemcpyHtoD_v2",), [_u64, _vp, _sz]),
    "cuMemcpyDtoH": (("cuMemcpyDtoH_v2",), [_vp, _u64, _sz]),
    "cuMemcpyHtoDAsync": (("cuMemcpyHtoDAsync_v2",), [_u64, _vp, _sz, _vp]),
    "cuMemcpyDtoHAsync": (("cuMemcpyDtoHAsync_v2",), [_vp, _u64, _sz, _vp]),
    "cuMemcpyPeer": (("cuMemcpyPeer",), [_u64, _vp, _u64, _vp, _sz]),
    "cuMemcpyPeerAsync": (("cuMemcpyPeerAsync",), [_u64, _vp, _u64, _vp, _sz, _vp]),
    "cuMemsetD8": (("cuMemsetD8_v2",), [_u64, ctypes.c_ubyte, _sz]),
    "cuStreamCreate": (("cuStreamCreate",), [ctypes.POINTER(_vp), _uint]),
    "cuStreamDestroy": (("cuStreamDestroy_v2", "cuStreamDestroy"), [_vp]),
    "cuStreamWaitEvent": (("cuStreamWaitEvent",), [_vp, _vp, _uint]),
    "cuEventCreate": (("cuEventCreate",), [ctypes.POINTER(_vp), _uint]),
    "cuEventRecord": (("cuEventRecord",), [_vp, _vp]),
    "cuEventSynchronize": (("cuEventSynchronize",), [_vp]),
    "cuEventElapsedTime": (("cuEventElapsedTime_v2", "cuEventElapsedTime"), [ctypes.POINTER(ctypes.c_float), _vp, _vp]),
    "cuEventDestroy": (("cuEventDestroy_v2", "cuEventDestroy"), [_vp]),
    "cuGetErrorName": (("cuGetErrorName",), [_int, ctypes.POINTER(ctypes.c_char_p)]),
}
CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DEFAULT = 0x0


class CudaBackend:
    """The CUDA driver API behind the engine's backend interface (device = sorted index)."""

    api = "cuda"
    errors_table = CU_ERRORS

    def __init__(self, library="libcuda.so.1"):
        self.library = library
        self.fn = None
        self.ctx = {}  # index -> primary context
        self.ordinal = {}  # index -> CUdevice

    def name(self, code):
        if code in CU_ERRORS:
            return CU_ERRORS[code]
        text = ctypes.c_char_p()
        if self.fn and self.fn["cuGetErrorName"](code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode(errors="replace")
        return error_name(code)

    def call(self, name, *args):
        code = self.fn[name](*args)
        if code != 0:
            raise ProbeError(name, code, self.name(code))

    def open(self):
        lib = ctypes.CDLL(self.library)
        self.fn = engine.bind(lib, CUDA_SYMBOLS)
        self.call("cuInit", 0)
        version = ctypes.c_int(0)
        self.call("cuDriverGetVersion", ctypes.byref(version))
        count = ctypes.c_int(0)
        self.call("cuDeviceGetCount", ctypes.byref(count))
        found = []
        for ordinal in range(count.value):
            dev = ctypes.c_int(0)
            self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
            name = ctypes.create_string_buffer(256)
            self.call("cuDeviceGetName", name, 256, dev.value)
            bus = ctypes.create_string_buffer(64)
            self.call("cuDeviceGetPCIBusId", bus, 64, dev.value)
            found.append(
                {
                    "ordinal": ordinal,
                    "device": dev.value,
                    "name": name.value.decode(errors="replace"),
                    "pci_bus_id": engine.normalize_bus_id(bus.value.decode(errors="replace")),
                }
            )
        devices = engine.order_devices(found)
        for dev in devices:
            ctx = _vp()
            self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev["device"])
            self.ctx[dev["index"]] = ctx
            self.ordinal[dev["index"]] = dev["device"]
        for dev in devices:
            dev.pop("device", None)
        return {
            "library": self.library,
            "driver_version": version.value,
            "driver": driver_text(version.value),
            "devices": devices,
        }

    def close(self):
        if not self.fn:
            return
        for index in sorted(self.ctx, reverse=True):
            self.fn["cuDevicePrimaryCtxRelease"](self.ordinal[index])
        self.ctx.clear()
        self.fn["cuCtxSetCurrent"](None)

    def set_device(self, dev):
        self.call("cuCtxSetCurrent", self.ctx[dev])

    def alloc(self, dev, n):
        self.set_device(dev)
        ptr = _u64(0)
        self.call("cuMemAlloc", ctypes.byref(ptr), n)
        return ptr.value

    def free(self, dev, ptr):
        self.set_device(dev)
        self.call("cuMemFree", ptr)

    def host_alloc(self, n):
        self.set_device(min(self.ctx))
        ptr = _vp()
        self.call("cuMemAllocHost", ctypes.byref(ptr), n)
        return ptr.value

    def host_free(self, ptr):
        self.set_device(min(self.ctx))
        self.call("cuMemFreeHost", ptr)

    def stream(self, dev):
        self.set_device(dev)
        s = _vp()
        self.call("cuStreamCreate", ctypes.byref(s), CU_STREAM_NON_BLOCKING)
        return s.value

    def stream_destroy(self, dev, s):
        self.set_device(dev)
        self.call("cuStreamDestroy", s)

    def event(self, dev):
        self.set_device(dev)
        e = _vp()
        self.call("cuEventCreate", ctypes.byref(e), CU_EVENT_DEFAULT)
        return e.value

    def event_destroy(self, dev, e):
        self.set_device(dev)
        self.call("cuEventDestroy", e)

    def record(self, dev, e, s):
        self.set_device(dev)
        self.call("cuEventRecord", e, s)

    def wait(self, dev, s, e):
        self.set_device(dev)
        self.call("cuStreamWaitEvent", s, e, 0)

    def event_sync(self, dev, e):
        self.call("cuEventSynchronize", e)

    def elapsed_ms(self, dev, a, b):
        ms = ctypes.c_float(0.0)
        self.call("cuEventElapsedTime", ctypes.byref(ms), a, b)
        return ms.value

    def h2d_async(self, dev, dptr, hptr, n, s):
        self.set_device(dev)
        self.call("cuMemcpyHtoDAsync", dptr, hptr, n, s)

    def d2h_async(self, dev, hptr, dptr, n, s):
        self.set_device(dev)
        self.call("cuMemcpyDtoHAsync", hptr, dptr, n, s)

    def h2d(self, dev, dptr, hptr, n):
        self.set_device(dev)
        self.call("cuMemcpyHtoD", dptr, hptr, n)
        self.call("cuCtxSynchronize")

    def d2h(self, dev, hptr, dptr, n):
        self.set_device(dev)
        self.call("cuMemcpyDtoH", hptr, dptr, n)

    def memset0(self, dev, dptr, n):
        self.set_device(dev)
        self.call("cuMemsetD8", dptr, 0, n)
        self.call("cuCtxSynchronize")

    def sync(self, dev):
        self.set_device(dev)
        self.call("cuCtxSynchronize")

    def peer(self, dst_dev, dptr_dst, src_dev, dptr_src, n):
        self.set_device(src_dev)
        self.call("cuMemcpyPeer", dptr_dst, self.ctx[dst_dev], dptr_src, self.ctx[src_dev], n)
        self.call("cuCtxSynchronize")
        self.set_device(dst_dev)
        self.call("cuCtxSynchronize")

    def peer_async(self, dst_dev, dptr_dst, src_dev, dptr_src, n, s):
        """Peer copy on S, a stream of SRC_DEV."""
        self.set_device(src_dev)
        self.call("cuMemcpyPeerAsync", dptr_dst, self.ctx[dst_dev], dptr_src, self.ctx[src_dev], n, s)

    def can_access(self, i, j):
        value = ctypes.c_int(0)
        self.call("cuDeviceCanAccessPeer", ctypes.byref(value), self.ordinal[i], self.ordinal[j])
        return value.value == 1

    def enable_peer(self, i, j):
        """Let device I's context access device J's memory; returns the CUresult (0 = ok)."""
        self.set_device(i)
        return self.fn["cuCtxEnablePeerAccess"](self.ctx[j], 0)

    def disable_peer(self, i, j):
        self.set_device(i)
        self.call("cuCtxDisablePeerAccess", self.ctx[j])


def probe(size_bytes=DEFAULT_SIZE, reps=DEFAULT_REPS, deadline_s=DEFAULT_DEADLINE_S, pairs=None, library=None):
    """Probe every GPU pair through libcuda.so.1 (see the module docstring). Never raises.

    PAIRS overrides the ordered pairs measured (default: every ordered pair of distinct GPUs);
    [(0, 0)] drives the peer code path on a one-GPU box (its figures mean nothing).
    """
    name = library or "libcuda.so.1"
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        found = ctypes.util.find_library("cuda")
        if not found or library:
            return engine.unavailable("cuda", "cannot load %s: %s" % (name, exc), library=name)
        name = found
    return engine.measure(CudaBackend(name), size_bytes, reps, deadline_s, pairs)


def probe_isolated(size_bytes=DEFAULT_SIZE, reps=DEFAULT_REPS, deadline_s=DEFAULT_DEADLINE_S, pairs=None, grace_s=30):
    """probe() in a forked child, killed after DEADLINE_S + GRACE_S."""
    return engine.run_isolated(
        probe, deadline_s + grace_s, api="cuda", size_bytes=size_bytes, reps=reps, deadline_s=deadline_s, pairs=pairs
    )


if __name__ == "__main__":  # pragma: no cover - manual use, the collection on sys.path:
    # python3 -m ansible_collections.rigbook.homelab.plugins.module_utils.probe.cuda [size_bytes] [reps]
    import sys

    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(probe(*args), indent=1, sort_keys=True))
