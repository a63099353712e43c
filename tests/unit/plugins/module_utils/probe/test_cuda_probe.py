"""The CUDA probe: pure helpers, the measurement engine over a fake driver, and the no-driver path.

Runs everywhere. The engine is driven through a fake backend that keeps device memory in Python
buffers and host memory in real ctypes buffers, so pattern checks, error shaping and the release
of every resource are tested without a GPU. One test uses the real driver when one is present.
"""

from __future__ import annotations

import ctypes
import json
import time

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import cuda as C
from ansible_collections.rigbook.homelab.plugins.module_utils.probe import engine as E

MIB = 1 << 20


class FakeBackend:
    """In-memory stand-in for the driver: the engine's backend interface, like CudaBackend."""

    api = "cuda"
    errors_table = C.CU_ERRORS

    def __init__(self, ngpu=2, enable=None, corrupt_peer=False, oom_on=None, fail_peer_async=False, open_error=None):
        self.ngpu = ngpu
        self.enable = enable or {}
        self.corrupt_peer = corrupt_peer
        self.oom_on = oom_on
        self.fail_peer_async = fail_peer_async
        self.open_error = open_error
        self.dev_mem = {}
        self.host_mem = {}
        self.live = set()
        self.next = 0x1000
        self.calls = []
        self.closed = False

    def _new(self, kind):
        self.next += 0x1000
        self.live.add((kind, self.next))
        return self.next

    def _gone(self, kind, handle):
        assert (kind, handle) in self.live, f"released twice or never made: {kind} {handle}"
        self.live.remove((kind, handle))

    def open(self):
        if self.open_error:
            raise self.open_error
        self.live.add(("ctx", 0))
        devs = [{"ordinal": k, "name": "Fake GPU", "pci_bus_id": f"0000:{0x40 - k:02x}:00.0"}
                for k in range(self.ngpu)]
        return {"library": "fake", "driver_version": 13000, "driver": "13.0", "devices": E.order_devices(devs)}

    def close(self):
        self.closed = True
        self.live.discard(("ctx", 0))

    def alloc(self, dev, n):
        if self.oom_on == dev:
            raise E.ProbeError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY")
        ptr = self._new("dev")
        self.dev_mem[ptr] = bytearray(n)
        return ptr

    def free(self, dev, ptr):
        self._gone("dev", ptr)

    def host_alloc(self, n):
        buf = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(buf)
        self.host_mem[addr] = buf
        self.live.add(("host", addr))
        return addr

    def host_free(self, ptr):
        self._gone("host", ptr)

    def stream(self, dev):
        return self._new("stream")

    def stream_destroy(self, dev, s):
        self._gone("stream", s)

    def event(self, dev):
        return self._new("event")

    def event_destroy(self, dev, e):
        self._gone("event", e)

    def record(self, dev, e, s):
        pass

    def wait(self, dev, s, e):
        pass

    def event_sync(self, dev, e):
        pass

    def elapsed_ms(self, dev, a, b):
        return 10.0

    def h2d(self, dev, dptr, hptr, n):
        self.dev_mem[dptr][:n] = ctypes.string_at(hptr, n)

    def d2h(self, dev, hptr, dptr, n):
        ctypes.memmove(hptr, bytes(self.dev_mem[dptr][:n]), n)

    h2d_async = lambda self, dev, dptr, hptr, n, s: self.h2d(dev, dptr, hptr, n)  # noqa: E731
    d2h_async = lambda self, dev, hptr, dptr, n, s: self.d2h(dev, hptr, dptr, n)  # noqa: E731

    def memset0(self, dev, dptr, n):
        self.dev_mem[dptr][:n] = bytes(n)

    def sync(self, dev):
        pass

    def peer(self, dst_dev, dptr_dst, src_dev, dptr_src, n):
        self.dev_mem[dptr_dst][:n] = self.dev_mem[dptr_src][:n]
        if self.corrupt_peer:
            self.dev_mem[dptr_dst][12345] ^= 0xFF

    def peer_async(self, dst_dev, dptr_dst, src_dev, dptr_src, n, s):
        if self.fail_peer_async:
            raise E.ProbeError("cuMemcpyPeerAsync", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
        self.peer(dst_dev, dptr_dst, src_dev, dptr_src, n)

    def can_access(self, i, j):
        return i != j

    def enable_peer(self, i, j):
        code = self.enable.get((i, j), 0)
        if code == 0:
            self.live.add(("peer", (i, j)))
        return code

    def disable_peer(self, i, j):
        self.live.remove(("peer", (i, j)))


def run(backend, **kw):
    kw.setdefault("size_bytes", 1 * MIB)
    kw.setdefault("reps", 2)
    out = E.measure(backend, **kw)
    json.dumps(out)  # JSON-able
    return out


# ------------------------------------------------------------------ pure helpers


def test_error_names_and_enable_results():
    assert C.error_name(205) == "CUDA_ERROR_MAP_FAILED"
    assert C.error_name(12345) == "CUDA_ERROR_12345"
    assert E.enable_result(0, C.CU_ERRORS) == "ok"
    assert E.enable_result(704, C.CU_ERRORS) == "already enabled"
    assert E.enable_result(205, C.CU_ERRORS) == "CUDA_ERROR_MAP_FAILED"
    assert E.enable_result(217, C.CU_ERRORS) == "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"


@pytest.mark.parametrize("raw, want", [
    ("00000000:03:00.0", "0000:03:00.0"),
    ("0000:C1:00.0", "0000:c1:00.0"),
    ("03:00.1", "0000:03:00.1"),
    ("0001:0A:1F.7\n", "0001:0a:1f.7"),
    ("", None),
    ("garbage", None),
])
def test_normalize_bus_id(raw, want):
    assert E.normalize_bus_id(raw) == want


def test_devices_are_indexed_by_bus_id_not_ordinal():
    devs = E.order_devices([{"ordinal": 0, "pci_bus_id": "0000:04:00.0"},
                            {"ordinal": 1, "pci_bus_id": "0000:03:00.0"}])
    assert [(d["index"], d["ordinal"]) for d in devs] == [(0, 1), (1, 0)]


def test_pairs():
    assert E.default_pairs(1) == []
    assert E.default_pairs(2) == [(0, 1), (1, 0)]
    assert len(E.default_pairs(3)) == 6
    assert E.unordered_pairs([(0, 1), (1, 0), (0, 2)]) == [(0, 1)]
    assert E.unordered_pairs([(0, 0)]) == [(0, 0)]


def test_pattern_is_seeded_has_no_zero_bytes_and_a_prime_period():
    a, b = E.pattern(1, 3 * 4096), E.pattern(2, 3 * 4096)
    assert len(a) == 3 * 4096 and a != b and 0 not in a
    assert a[:4096] != a[4096:8192]  # a page-shifted copy cannot pass
    assert E.first_mismatch(a, a) is None
    broken = bytearray(a)
    broken[5000] ^= 1
    assert E.first_mismatch(bytes(broken), a) == 5000


def test_gbs_and_driver_text():
    assert E.gbs(10 ** 9, 1000.0) == 1.0
    assert E.gbs(256 * MIB, 0) is None and E.gbs(1, None) is None
    assert C.driver_text(13000) == "13.0" and C.driver_text(12040) == "12.4" and C.driver_text(0) is None


# ------------------------------------------------------------------ the engine over a fake driver


def test_two_gpus_measure_every_pair_and_release_everything():
    fake = FakeBackend()
    out = run(fake)
    assert out["available"] is True and out["driver"] == "13.0"
    assert [d["pci_bus_id"] for d in out["devices"]] == ["0000:3f:00.0", "0000:40:00.0"]
    assert [(p["src"], p["dst"]) for p in out["pairs"]] == [(0, 1), (1, 0)]
    for pair in out["pairs"]:
        assert pair["can_access_peer"] is True and pair["enable_peer"] == "ok"
        assert pair["pattern_ok"] is True and pair["staged_pattern_ok"] is True
        assert pair["peer_gbs"] == E.gbs(2 * MIB, 10.0) and pair["host_staged_gbs"] == E.gbs(2 * MIB, 10.0)
        assert pair["errors"] == []
    assert [(b["a"], b["b"]) for b in out["bidir"]] == [(0, 1)] and out["bidir"][0]["gbs"] == E.gbs(4 * MIB, 10.0)
    assert all(d["h2d_gbs"] and d["d2h_gbs"] for d in out["devices"])
    assert fake.live == set() and fake.closed and "cleanup_errors" not in out
    assert out["elapsed_s"] >= 0 and out["deadline_hit"] is False


def test_one_gpu_has_no_pairs_but_host_copies():
    fake = FakeBackend(ngpu=1)
    out = run(fake)
    assert out["pairs"] == [] and out["bidir"] == []
    assert out["devices"][0]["h2d_gbs"] and out["devices"][0]["d2h_gbs"]
    assert fake.live == set()


def test_map_failed_is_named_and_the_copy_still_runs():
    """Seed 000: enabling fails with CUDA_ERROR_MAP_FAILED; the driver still copies through the host."""
    fake = FakeBackend(enable={(0, 1): 205, (1, 0): 205})
    out = run(fake)
    assert [p["enable_peer"] for p in out["pairs"]] == ["CUDA_ERROR_MAP_FAILED"] * 2
    assert all(p["pattern_ok"] and p["peer_gbs"] for p in out["pairs"])
    assert fake.live == set()  # nothing to disable: enabling never succeeded


def test_already_enabled_is_not_an_error():
    out = run(FakeBackend(enable={(0, 1): 704}))
    assert out["pairs"][0]["enable_peer"] == "already enabled"


def test_a_corrupting_peer_copy_fails_the_pattern_with_the_offset():
    out = run(FakeBackend(corrupt_peer=True))
    pair = out["pairs"][0]
    assert pair["pattern_ok"] is False and "byte 12345" in pair["errors"][0]


def test_out_of_memory_on_one_gpu_skips_its_pairs_and_still_releases():
    fake = FakeBackend(oom_on=1)
    out = run(fake)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in out["devices"][1]["errors"][0]
    assert out["devices"][1]["h2d_gbs"] is None and out["devices"][0]["h2d_gbs"]
    assert all("could not be allocated" in p["errors"][0] for p in out["pairs"])
    assert fake.live == set()


def test_a_failing_async_peer_copy_is_reported_per_pair():
    fake = FakeBackend(fail_peer_async=True)
    out = run(fake)
    assert out["pairs"][0]["peer_gbs"] is None
    assert any("CUDA_ERROR_ILLEGAL_ADDRESS" in e for e in out["pairs"][0]["errors"])
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in out["bidir"][0]["errors"][0]
    assert fake.live == set()


def test_deadline_skips_the_rest_and_says_so():
    out = run(FakeBackend(), deadline_s=0)
    assert out["deadline_hit"] is True
    assert all("deadline" in " ".join(p["errors"]) for p in out["pairs"])


def test_open_failure_is_unavailable_not_an_exception():
    fake = FakeBackend(open_error=E.ProbeError("cuInit", 100, "CUDA_ERROR_NO_DEVICE"))
    out = run(fake)
    assert out == {"available": False, "api": "cuda", "error": "cuInit: CUDA_ERROR_NO_DEVICE",
                   "probe_version": E.PROBE_VERSION, "library": None}


def test_no_devices_is_unavailable():
    out = run(FakeBackend(ngpu=0))
    assert out["available"] is False and "no GPU" in out["error"]


def test_explicit_self_pair_drives_the_peer_path_on_one_gpu():
    fake = FakeBackend(ngpu=1, enable={(0, 0): 201})
    out = run(fake, pairs=[(0, 0)])
    (pair,) = out["pairs"]
    assert pair["can_access_peer"] is False and pair["enable_peer"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert pair["pattern_ok"] is True and out["bidir"][0]["a"] == 0
    assert fake.live == set()


def test_pairs_naming_missing_devices_are_dropped_with_an_error():
    out = run(FakeBackend(ngpu=1), pairs=[(0, 3)])
    assert out["pairs"] == [] and "do not exist" in out["errors"][0]


# ------------------------------------------------------------------ the real library, or its absence


def test_missing_library_is_unavailable_not_an_exception():
    out = C.probe(library="/nonexistent/libcuda.so.1")
    assert out["available"] is False and "cannot load" in out["error"]


def test_run_isolated_returns_the_child_result():
    out = E.run_isolated(lambda **kw: {"available": True, "echo": kw}, 10, x=1)
    assert out == {"available": True, "echo": {"x": 1}}


def test_run_isolated_reports_a_raising_probe():
    def boom():
        raise RuntimeError("driver exploded")

    out = E.run_isolated(boom, 10)
    assert out["available"] is False and "driver exploded" in out["error"]


def test_run_isolated_kills_a_hung_probe():
    start = time.monotonic()
    out = E.run_isolated(lambda: time.sleep(60), 0.5)
    assert out["available"] is False and out["timed_out"] is True
    assert time.monotonic() - start < 10


def test_probe_on_this_machine_never_raises():
    """Without a GPU: available false. With one (the device run): real figures, nothing left over."""
    out = C.probe_isolated(size_bytes=8 * MIB, reps=3, deadline_s=10)
    json.dumps(out)
    if not out["available"]:
        assert out["error"]
        return
    assert out["driver_version"] > 0 and out["devices"]
    for dev in out["devices"]:
        assert E.normalize_bus_id(dev["pci_bus_id"]) == dev["pci_bus_id"]
        assert dev["h2d_gbs"] > 1 and dev["d2h_gbs"] > 1, dev
    assert len(out["pairs"]) == len(out["devices"]) * (len(out["devices"]) - 1)
    assert all(p["pattern_ok"] for p in out["pairs"])
    assert "cleanup_errors" not in out and out["elapsed_s"] < 10
