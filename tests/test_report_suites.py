"""The shipped suites' reports, from rows shaped like each suite (tests/report_synthetic.py):
findings first and linked, at most MAX_SERIES series per panel, and, in headless Chromium, no
two text elements of a figure overlapping (rendered bounding boxes); plus the results site."""

from __future__ import annotations

import re

import pytest
import report_browser
import report_synthetic as syn

from kvbench.cli import main
from kvbench.report.page import write_report
from kvbench.report.styles import MAX_SERIES

WANTED = {  # figures each suite's question needs
    "default": {"latency", "formats", "memory", "bandwidth", "roofline", "accuracy"},
    "quant": {"latency", "formats", "accuracy", "memory", "roofline"},
    "streams": {"latency", "layouts", "memory", "bandwidth"},
    "tiles": {"latency", "tiles", "formats"},
    "peers": {"latency", "peers", "roofline"},
}
TOPICS = {  # findings each suite's report must open with
    "default": {"fastest", "formats vs fp16"},
    "quant": {"fastest", "formats vs fp16", "accuracy"},
    "streams": {"unified vs per-stream"},  # fastest would repeat it (layout is the only choice)
    "tiles": {"best tile", "fastest"},
    "peers": {"kvbench vs peers", "fastest"},
}


@pytest.fixture(scope="module", params=syn.SUITES)
def suite_report(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    syn.suite_rows(request.param).to_csv(d / "rows.csv", index=False)
    out, _ = write_report([d / "rows.csv"], d / "report.html")
    return request.param, out, out.read_text(encoding="utf-8")


def test_findings_open_the_page_and_link_to_its_figures(suite_report):
    name, _, text = suite_report
    body = text.split("<body>", 1)[1]
    assert body.index('id="findings"') < body.index('<section class="figure"')
    figures = set(re.findall(r'<section class="figure" id="([a-z]+)"', text))
    assert WANTED[name] <= figures, figures
    links = re.findall(r'<li class="finding[^"]*">.*?<a href="#([a-z]+)"', text)
    assert links and set(links) <= figures
    topics = set(re.findall(r'<span class="topic">([^<]+)</span>', text))
    assert TOPICS[name] <= topics, topics


@pytest.mark.skipif(
    report_browser.chromium() is None,
    reason="chromium not installed (apt-get install -y chromium); .ci/run installs it",
)
def test_rendered_text_never_overlaps_and_panels_stay_readable(suite_report):
    name, out, _ = suite_report
    got = report_browser.probe(out)
    assert got["errors"] == [] and got["plots"] == got["drawn"], got
    assert got["overlaps"] == [], got["overlaps"][:10]
    assert max(got["series"].values()) <= MAX_SERIES, got["series"]
    assert got["links"]["n"] > 0 and got["links"]["bad"] == [], got["links"]


def test_site_of_a_results_directory(tmp_path, capsys):
    for name in ("default", "streams"):
        syn.suite_rows(name).to_csv(tmp_path / f"{name}.csv", index=False)
    old = syn.suite_rows("default").assign(
        run_id="20261122T120000Z-old", timestamp="2026-11-22T12:00:00+00:00"
    )
    old.to_csv(tmp_path / "default-old.csv", index=False)
    site = tmp_path / "site"
    assert main(["report", str(tmp_path), "-o", str(site)]) == 0
    assert "(4 pages)" in capsys.readouterr().out  # 2 suites, 1 history
    index = (site / "index.html").read_text()
    for link in ("suite-default.html", "suite-streams.html", "history-default.html"):
        assert f'href="{link}"' in index and (site / link).exists()
    assert index.count("<tr>") == 1 + 3  # header + three runs
    page = (site / "suite-default.html").read_text()
    assert '<script src="plotly.min.js"></script>' in page and 'id="findings"' in page
    assert (site / "plotly.min.js").stat().st_size > 1_000_000
    assert 'id="history"' in (site / "history-default.html").read_text()
