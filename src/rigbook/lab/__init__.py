"""The lab: local simulated rigs for real Ansible runs (docs/lab.md).

Debian bookworm containers booted with systemd-nspawn (real systemd, sshd, sudo, apt), reached
over SSH on 127.0.0.0/8 only, each carrying a recorded GPU hardware tree at the evidence boundary.
"""
