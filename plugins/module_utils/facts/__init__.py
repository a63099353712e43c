# -*- coding: utf-8 -*-
# Copyright: rigbook developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One reader per host fact (standard library only, Python 3.8+): every feature reads the box through these.

Each module is a command or a file read plus a pure parser, tested as data; what it returns is typed and bounded
(lengths, character sets, finite numbers), so a value a box printed is data, never text for a template.

- files:     the evidence root, bounded file reads, the sha256 of a file, the one atomic write (never through a link)
- runner:    the one command runner (LC_ALL=C, timeouts, bounded output); live or recorded under an evidence root
- systemd:   `systemctl show` (the one parser) and `systemctl get-default`
- packages:  what dpkg has installed (the one dpkg reader: dpkg-query) and what apt could install (apt-cache policy)
- kernel:    the running release, the command line and its boot-only words
- libraries: the libraries a process has mapped, and which of them is NCCL or RCCL
- builds:    build stamps and group-build archive names (one writer, one parser each)
- api_key:   the serve profile's API key file
- sockets:   who listens on a port: /proc/net/tcp{,6}, the process holding the socket, its control group
- text:      the bounds every reader applies to what a box printed
"""
