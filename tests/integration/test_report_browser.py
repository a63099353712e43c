"""`provision report` in a real headless browser: Debian's Chromium, the network off, a screenshot kept.

The run history is the one tests/unit/rigbook/test_report.py checks (helpers.report.lab_report_history):
`provision baseline record -i lab` and four verify runs written through rigbook's own writers, every ladder the real
climb over the lab's recorded hardware trees, the fourth with `lab break lab-r9700 busbw-half` applied to the R9700
twin's tree.
It is built from those trees in-process, not from live lab hosts (the lab is shared; the figures are the same
recorded trees the lab hosts read).

Chromium is installed through apt-get when missing (as the lab installs its tools: src/rigbook/lab/system.py).
The screenshot is kept as tests/artifacts-out/report.png; with RIGBOOK_UPDATE_SCREENSHOT=1 (or when it is missing)
it is also copied to docs/report.png, the README's picture.
"""

from __future__ import annotations

import os
import shutil
import time

from helpers.browser import browse, chromium, page_dom
from helpers.cli import REPO
from helpers.report import lab_report_history

from rigbook import report
from rigbook.baselines import metrics_of

ARTIFACTS = REPO / "tests" / "artifacts-out"
def test_report_in_headless_chromium(tmp_path, monkeypatch):
    binary = chromium()
    monkeypatch.setenv("RIGBOOK_STATE_DIR", str(tmp_path / "state"))
    history = lab_report_history(tmp_path / "trees")
    started = time.monotonic()
    page, _ = report.write_report("lab", str(tmp_path / "report.html"))
    render_s = time.monotonic() - started
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # nothing to fetch: the page opens with the network off

    profile = tmp_path / "chromium"
    profile.mkdir()
    find = page_dom(page, profile)

    latest = history["runs"][-1]
    for host, runs in history["hosts"].items():
        assert find("section", class_="host", data_host=host)
        layers = [e["data-layer"] for e in find("tr", data_host=host) if "data-layer" in e]
        assert layers == [v["layer"] for v in runs[latest]]
        for run, ladder in runs.items():
            for metric, value in metrics_of(ladder).items():
                (point,) = find("circle", data_host=host, data_metric=metric, data_run=run)
                assert float(point["data-value"]) == value
    assert len(find("circle")) == 65

    faulted = history["faulted"]
    for metric in ("sendrecv_busbw_gbs", "all_reduce_busbw_gbs"):
        (band,) = find("rect", data_band="fail", data_host="lab-r9700", data_metric=metric)
        (point,) = find("circle", data_host="lab-r9700", data_metric=metric, data_run=faulted)
        top, bottom = float(band["y"]), float(band["y"]) + float(band["height"])
        assert point["data-status"] == "fail"
        assert top < float(point["cy"]) <= bottom, (metric, point["cy"], top, bottom)  # below the fail line

    shot = tmp_path / "report.png"
    taken = browse(binary, page, profile, f"--screenshot={shot}", "--window-size=1280,2400")
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") == 1280
    assert len(png) > 50_000  # a drawn page, not a blank one
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "report.png")
    shutil.copy(page, ARTIFACTS / "report.html")
    readme_picture = REPO / "docs" / "report.png"
    if os.environ.get("RIGBOOK_UPDATE_SCREENSHOT") or not readme_picture.exists():
        shutil.copy(shot, readme_picture)
    print(f"report {len(text)} bytes, rendered in {render_s:.3f} s; screenshot {len(png)} bytes: "
          f"{ARTIFACTS / 'report.png'}")
