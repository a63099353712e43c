"""artifact's glue, in-process: real files with real sha256s under tmp_path, downloads over file:// and from a
loopback http.server; the module runs no command (the fake runner's table stays empty), so any it ran would fail."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading

import pytest
from ansible_collections.rigbook.homelab.plugins.modules import artifact
from helpers.modules import run_module

DATA = b"rigbook stand-in artifact\n" * 64
SHA = hashlib.sha256(DATA).hexdigest()
OTHER = hashlib.sha256(b"something else").hexdigest()


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "offline" / "nvidia-fork-615.71.09.tar.gz"
    path.parent.mkdir()
    path.write_bytes(DATA)
    return path


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "cache" / "artifacts"


def listing(path):
    return sorted(os.listdir(path)) if path.exists() else None


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/files/fork.tar.gz":
            self.send_response(200)
            self.send_header("Content-Length", str(len(DATA)))
            self.end_headers()
            self.wfile.write(DATA)
        elif self.path == "/files/truncated.tar.gz":  # promises more than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", str(len(DATA)))
            self.end_headers()
            self.wfile.write(DATA[:100])
            self.close_connection = True
        else:
            self.send_error(404, "File not found")

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    """http://127.0.0.1:PORT serving DATA at /files/fork.tar.gz (loopback only; proxies bypassed)."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# --- a path on the host --------------------------------------------------------------------------------------

def test_a_path_with_its_sha256_is_verified_in_place(blob):
    run = run_module(artifact, {"path": str(blob), "sha256": SHA.upper()})
    assert not run.failed, run.msg
    assert run.commands == []
    assert run.result == {"changed": False, "path": str(blob), "paths": [str(blob)]}


def test_check_mode_verifies_a_path_the_same_way(blob):
    run = run_module(artifact, {"path": str(blob), "sha256": SHA}, check_mode=True)
    assert not run.failed and run.result["changed"] is False
    run = run_module(artifact, {"path": str(blob), "sha256": OTHER}, check_mode=True)
    assert run.failed and run.msg.startswith("refused artifact")


def test_a_path_with_another_sha256_is_refused(blob):
    run = run_module(artifact, {"path": str(blob), "sha256": OTHER})
    assert run.failed
    assert run.msg == f"refused artifact {blob}: sha256 {SHA}, pinned {OTHER}"
    assert run.result["sha256"] == SHA and run.result["path"] == str(blob)


def test_a_missing_path_is_named(tmp_path):
    run = run_module(artifact, {"path": str(tmp_path / "nope.deb"), "sha256": SHA})
    assert run.failed and run.msg == f"artifact {tmp_path / 'nope.deb'} does not exist on the host"


# --- a URL ---------------------------------------------------------------------------------------------------

def test_a_file_url_is_downloaded_once_then_reused(blob, dest):
    params = {"url": blob.as_uri(), "sha256": SHA, "dest_dir": str(dest)}
    run = run_module(artifact, params)
    assert not run.failed, run.msg
    assert run.result == {"changed": True, "path": str(dest / blob.name), "paths": [str(dest / blob.name)]}
    assert (dest / blob.name).read_bytes() == DATA
    assert (dest / blob.name).stat().st_mode & 0o777 == 0o644
    assert listing(dest) == [blob.name]  # no temporary download left
    again = run_module(artifact, params)
    assert not again.failed and again.result["changed"] is False and again.result["path"] == str(dest / blob.name)


def test_check_mode_reports_a_download_and_writes_nothing(blob, dest):
    run = run_module(artifact, {"url": blob.as_uri(), "sha256": SHA, "dest_dir": str(dest)}, check_mode=True)
    assert not run.failed and run.result["changed"] is True and run.result["path"] == str(dest / blob.name)
    assert listing(dest) is None


def test_a_cached_copy_with_another_sha256_is_downloaded_again(blob, dest):
    dest.mkdir(parents=True)
    (dest / blob.name).write_bytes(b"stale")
    run = run_module(artifact, {"url": blob.as_uri(), "sha256": SHA, "dest_dir": str(dest)})
    assert not run.failed and run.result["changed"] is True
    assert (dest / blob.name).read_bytes() == DATA


def test_a_download_with_another_sha256_is_discarded(blob, dest):
    run = run_module(artifact, {"url": blob.as_uri(), "sha256": OTHER, "dest_dir": str(dest)})
    assert run.failed
    assert run.msg == f"refused artifact {blob.as_uri()}: sha256 {SHA}, pinned {OTHER} (download discarded)"
    assert listing(dest) == []


def test_a_missing_file_url_is_a_clear_failure(tmp_path, dest):
    url = (tmp_path / "nope.tar.gz").as_uri()
    run = run_module(artifact, {"url": url, "sha256": SHA, "dest_dir": str(dest)})
    assert run.failed and run.msg.startswith(f"could not fetch {url}: ") and "No such file" in run.msg
    assert listing(dest) == []


def test_an_http_download_from_a_loopback_server(server, dest):
    run = run_module(artifact, {"url": f"{server}/files/fork.tar.gz", "sha256": SHA, "dest_dir": str(dest)})
    assert not run.failed, run.msg
    assert run.result["changed"] is True and (dest / "fork.tar.gz").read_bytes() == DATA


def test_an_http_404_is_a_clear_failure(server, dest):
    url = f"{server}/files/gone.tar.gz"
    run = run_module(artifact, {"url": url, "sha256": SHA, "dest_dir": str(dest)})
    assert run.failed and run.msg == f"could not fetch {url}: HTTP Error 404: File not found"
    assert listing(dest) == []


def test_a_truncated_http_download_is_refused_and_discarded(server, dest):
    url = f"{server}/files/truncated.tar.gz"
    run = run_module(artifact, {"url": url, "sha256": SHA, "dest_dir": str(dest)})
    cut = hashlib.sha256(DATA[:100]).hexdigest()
    assert run.failed and run.msg == f"refused artifact {url}: sha256 {cut}, pinned {SHA} (download discarded)"
    assert listing(dest) == []


# --- several artifacts ---------------------------------------------------------------------------------------

def test_several_artifacts_in_one_call(blob, dest):
    items = [{"path": str(blob), "sha256": SHA}, {"url": blob.as_uri(), "sha256": SHA}]
    run = run_module(artifact, {"artifacts": items, "dest_dir": str(dest)})
    assert not run.failed, run.msg
    assert run.result == {"changed": True, "path": str(blob), "paths": [str(blob), str(dest / blob.name)]}


def test_the_first_mismatch_fails_the_call(blob, dest):
    items = [{"path": str(blob), "sha256": SHA}, {"url": blob.as_uri(), "sha256": OTHER}]
    run = run_module(artifact, {"artifacts": items, "dest_dir": str(dest)})
    assert run.failed and "(download discarded)" in run.msg and listing(dest) == []


# --- bad input -----------------------------------------------------------------------------------------------

BAD_INPUT = {
    "url-and-path": ({"url": "file:///x", "path": "/x", "sha256": SHA},
                     "parameters are mutually exclusive: url|path|artifacts"),
    "neither": ({"sha256": SHA}, "one of the following is required: url, path, artifacts"),
    "url-without-sha256": ({"url": "file:///x"}, "missing parameter(s) required by 'url': sha256"),
    "item-without-sha256": ({"artifacts": [{"path": "/x"}]},
                            "an artifact needs a sha256 and exactly one of url or path: {'path': '/x'}"),
    "item-with-url-and-path": ({"artifacts": [{"url": "file:///x", "path": "/x", "sha256": SHA}]},
                               "an artifact needs a sha256 and exactly one of url or path"),
    "short-sha256": ({"path": "/x", "sha256": "abc123"}, "sha256 of /x must be 64 hex digits, not 'abc123'"),
    "sha256-not-a-string": ({"artifacts": [{"path": "/x", "sha256": 12345}]},
                            "sha256 of /x must be 64 hex digits, not 12345"),
    "ftp-url": ({"url": "ftp://127.0.0.1/fork.tar.gz", "sha256": SHA},
                "unsupported URL ftp://127.0.0.1/fork.tar.gz: use https://, http:// or file://"),
    "url-without-scheme": ({"url": "127.0.0.1/fork.tar.gz", "sha256": SHA},
                           "unsupported URL 127.0.0.1/fork.tar.gz: use https://, http:// or file://"),
}


@pytest.mark.parametrize("params,message", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_is_one_clear_message(params, message, dest):
    run = run_module(artifact, {**params, "dest_dir": str(dest)})
    assert run.failed and run.msg.startswith(message), run.msg
    assert listing(dest) is None
