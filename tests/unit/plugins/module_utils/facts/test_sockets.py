"""facts/sockets.py: who listens on a TCP port. The parsers on /proc text in the kernel's format (the tables below are
lines read on an x86-64 box, little-endian as the kernel prints its words, with their ports and inodes set for the
tests), the readers on a recorded evidence root and, once, live on loopback (a listener of this test's own
process)."""

from __future__ import annotations

import ipaddress
import os
import socket

from ansible_collections.rigbook.homelab.plugins.module_utils.facts import sockets
from helpers import recorded_proc

# /proc/net/tcp: 127.0.0.1:30000 and 0.0.0.0:30001 listening, a connection to 127.0.0.1:30000 established.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000   999        0 4242 1 00000000e7e045d0 100 0 0 10 0
   1: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1 00000000cd8c24bd 100 0 0 10 0
   2: 0100007F:D2F0 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 4250 1 0000000070d83a89 20 4 30 10 -1
"""  # noqa: E501
# /proc/net/tcp6: [::1]:30000, [::]:30002 and [::ffff:127.0.0.1]:30003 listening.
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5001 1 00000000219a6ec7 100 0 0 10 0
   1: 00000000000000000000000000000000:7532 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5002 1 0000000019982def 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:7533 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5003 1 0000000019982def 100 0 0 10 0
"""  # noqa: E501


def test_the_tables_are_read_with_their_addresses_ports_states_and_inodes():
    assert sockets.parse_tcp(TCP, 4) == [
        {"address": "127.0.0.1", "port": 30000, "state": "0A", "inode": 4242, "family": 4},
        {"address": "0.0.0.0", "port": 30001, "state": "0A", "inode": 4243, "family": 4},
        {"address": "127.0.0.1", "port": 54000, "state": "01", "inode": 4250, "family": 4},
    ]
    assert [(ipaddress.ip_address(s["address"]), s["port"], s["inode"]) for s in sockets.parse_tcp(TCP6, 6)] == [
        (ipaddress.ip_address(a), port, inode)
        for a, port, inode in (("::1", 30000, 5001), ("::", 30002, 5002), ("::ffff:127.0.0.1", 30003, 5003))]


def test_lines_of_another_shape_are_passed_by():
    garbled = ("header\n"
               "   0: 0100007F:7530 00000000:0000 0A\n"  # cut short
               "   1: 0100007Z:7530 00000000:0000 0A 0:0 0:0 0 0 0 77\n"  # not hex
               "   2: 0100007F:7530 00000000:0000 0A 0:0 0:0 0 0 0 inode\n"  # no inode number
               "   3: 0100007F 00000000:0000 0A 0:0 0:0 0 0 0 78\n")  # no port
    assert sockets.parse_tcp(garbled, 4) == [] and sockets.parse_tcp(None, 6) == []
    assert sockets.parse_tcp(TCP, 6) == []  # an IPv4 table read as IPv6: no address of that length


def test_an_fd_link_names_a_socket_inode_only_in_the_kernels_spelling():
    assert sockets.socket_inode("socket:[4242]") == 4242
    for target in ("pipe:[4242]", "/tmp/socket:[4242]", "socket:[]", "socket:[42x]", None):
        assert sockets.socket_inode(target) is None


def test_control_groups_are_read_in_systemds_hierarchies_only():
    unified = "0::/system.slice/rigbook-serve-qwen.service\n"
    hybrid = ("12:memory:/user.slice\n9:name=systemd:/system.slice/rigbook-serve-qwen.service\n"
              "0::/system.slice/rigbook-serve-qwen.service\n")
    assert sockets.parse_cgroup(unified) == ["/system.slice/rigbook-serve-qwen.service"]
    assert sockets.parse_cgroup(hybrid) == ["/system.slice/rigbook-serve-qwen.service"] * 2
    assert sockets.parse_cgroup("4:memory:/system.slice/rigbook-serve-qwen.service\n") == []  # another controller
    group = "/system.slice/rigbook-serve-qwen.service"
    assert sockets.in_group([group], group) and sockets.in_group([group + "/payload"], group)
    assert not sockets.in_group(["/system.slice/rigbook-serve-qwen.service-evil"], group)
    assert not sockets.in_group(["/user.slice"], group) and not sockets.in_group([group], "")


def recorded_root(tmp_path, procs):
    return recorded_proc.recorded_root(tmp_path, TCP, TCP6, procs)


def test_the_readers_find_the_listeners_of_a_port_and_who_holds_them_under_a_recorded_root(tmp_path):
    root = recorded_root(tmp_path, {100: ("0::/system.slice/a.service\n", [4242, 4250]),
                                    101: ("0::/system.slice/a.service/worker\n", [4242]),
                                    200: ("0::/user.slice/user-1000.slice\n", [5001])})
    assert [(s["address"], s["inode"]) for s in sockets.listening(root, 30000)] == [("127.0.0.1", 4242),
                                                                                      ("::1", 5001)]
    assert sockets.listening(root, 30009) == []
    assert sockets.holders(root, [4242, 5001, 4243]) == {4242: [100, 101], 5001: [200], 4243: []}
    assert sockets.cgroups_of(root, 101) == ["/system.slice/a.service/worker"]
    assert sockets.cgroups_of(root, 999) == []


def test_live_a_listener_of_this_process_is_found_with_its_inode_and_holder():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        [found] = sockets.listening("/", port)
        assert found["address"] == "127.0.0.1" and found["inode"] == os.fstat(sock.fileno()).st_ino
        assert os.getpid() in sockets.holders("/", [found["inode"]])[found["inode"]]
