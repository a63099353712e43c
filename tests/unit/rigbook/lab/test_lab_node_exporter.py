"""node_exporter on the lab hosts (Debian's prometheus-node-exporter, docs/lab.md): in the cached rootfs's recipe;
each host's defaults file binds it to the host's own address (the hosts share this machine's network) with the
textfile collector on the folder the health timer writes; `lab up` refuses an address whose port 9100 is taken.
The lab test reads it over HTTP (tests/integration/test_health_exporter_lab.py)."""

from __future__ import annotations

import shlex
import socket

import pytest
from ansible_collections.rigbook.homelab.plugins.module_utils import host_model

from rigbook.errors import UserError
from rigbook.lab import machine, rootfs, state


def test_the_rootfs_has_node_exporter_and_each_host_binds_its_own_address():
    assert "prometheus-node-exporter" in rootfs.load_recipe()["packages"]
    host = state.Host(name="lab-r9700", rig="x99-r9700", group="x99_r9700", address="127.9.11.2")
    text = machine.NODE_EXPORTER_DEFAULTS.format(address=host.address, port=machine.NODE_EXPORTER_PORT)
    [args] = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ARGS=")]
    # systemd's EnvironmentFile takes the quoted value; the unit's ExecStart splits $ARGS at the spaces
    [value] = shlex.split(args)
    assert value.split() == ["--web.listen-address=127.9.11.2:9100",
                             f"--collector.textfile.directory={host_model.TEXTFILE_DIR}"]


def test_a_taken_node_exporter_port_is_refused_naming_it():
    host = state.Host(name="lab-r9700", rig="x99-r9700", group="x99_r9700", address="127.9.11.2", port=0)
    machine.check_port_free(host)  # both free
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host.address, machine.NODE_EXPORTER_PORT))
    listener.listen()
    try:
        with pytest.raises(UserError, match=r"port taken: 127\.9\.11\.2:9100 \(for lab-r9700\)"):
            machine.check_port_free(host)
    finally:
        listener.close()
