"""Open a report in headless Chromium, offline, and read back what rendered.

A probe script is injected at the top of <head> (in a copy of the page): it records
console.error calls, uncaught errors, failed resource loads and unhandled rejections, and after
the load event writes a JSON summary into <pre id="kvbench-probe">; --dump-dom prints the DOM.
Network is cut (proxy to a closed port, host resolution disabled), so any fetch would fail and
be recorded. Also used by hand to screenshot a report (see docs/report.md).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PROBE = """<script>
window.__kvErrors = [];
var TEXT = ".gtitle, .xtick text, .ytick text, .legendtext, .annotation-text, " +
  ".g-xtitle text, .g-ytitle text, .g-x2title text, .g-y2title text";
function __kvBoxes(p) {
  var out = [];
  p.querySelectorAll(TEXT).forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (e.textContent.trim() && r.width > 0 && r.height > 0) out.push({t: e.textContent, r: r});
  });
  return out;
}
function __kvOverlaps(plots) {  // pairs of text boxes of one plot overlapping by > 1 px
  var found = [];
  plots.forEach(function (p) {
    var b = __kvBoxes(p);
    for (var i = 0; i < b.length; i++) for (var j = i + 1; j < b.length; j++) {
      var a = b[i].r, c = b[j].r;
      var w = Math.min(a.right, c.right) - Math.max(a.left, c.left);
      var h = Math.min(a.bottom, c.bottom) - Math.max(a.top, c.top);
      if (w > 1 && h > 1) found.push([p.id, b[i].t, b[j].t]);
    }
  });
  return found;
}
function __kvSeries(plots) {  // plot id -> the most series drawn in one panel (not reference lines)
  var out = {};
  plots.forEach(function (p) {
    var per = {};
    (p._fullData || []).forEach(function (t) {
      if (t.meta === "ref" || t.visible === false) return;
      var k = (t.xaxis || "x") + (t.yaxis || "y");
      per[k] = (per[k] || 0) + 1;
    });
    out[p.id] = Math.max.apply(null, [0].concat(Object.values(per)));
  });
  return out;
}
function __kvLinks() {  // findings links whose target is not a figure section
  var bad = [], n = 0;
  document.querySelectorAll(".findings a[href^='#']").forEach(function (a) {
    n++;
    var t = document.getElementById(a.getAttribute("href").slice(1));
    if (!t || !t.classList.contains("figure")) bad.push(a.getAttribute("href"));
  });
  return {n: n, bad: bad};
}
(function () {
  var orig = console.error;
  console.error = function () {
    window.__kvErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return orig.apply(console, arguments);
  };
  window.addEventListener("error", function (e) {
    var t = e.target && (e.target.src || e.target.href);
    window.__kvErrors.push("error: " + (e.message || t || "resource failed"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    window.__kvErrors.push("unhandled rejection: " + e.reason);
  });
  window.addEventListener("load", function () {
    setTimeout(function () {
      var plots = document.querySelectorAll(".js-plotly-plot"), drawn = 0, traces = 0;
      plots.forEach(function (p) {
        if (p.querySelector(".main-svg") && p._fullData && p._fullData.length) drawn++;
        traces += p._fullData ? p._fullData.length : 0;
      });
      var pre = document.createElement("pre");
      pre.id = "kvbench-probe";
      pre.textContent = JSON.stringify({
        overlaps: __kvOverlaps(plots), series: __kvSeries(plots), links: __kvLinks(),
        plots: plots.length, drawn: drawn, traces: traces,
        svgs: document.querySelectorAll(".main-svg").length,
        plotly: typeof Plotly === "undefined" ? null : Plotly.version,
        errors: window.__kvErrors
      });
      document.body.appendChild(pre);
    }, 1000);
  });
})();
</script>"""

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars",
)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="kvbench-chromium-") as profile:
        cmd = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def probe(report: str | Path, timeout: float = 120) -> dict:
    """Render the report; the probe's summary plus chromium's stderr lines about the page."""
    text = Path(report).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="kvbench-probe-") as d:
        page = Path(d) / "probed.html"
        page.write_text(text.replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8")
        res = _run(
            ["--virtual-time-budget=30000", "--enable-logging=stderr", "--v=0", "--dump-dom",
             "--window-size=1400,1000",
             page.as_uri()],
            timeout,
        )  # fmt: skip
    m = re.search(r'<pre id="kvbench-probe">(.*?)</pre>', res.stdout, re.S)
    if not m:
        raise RuntimeError(f"no probe output (rc={res.returncode}): {res.stderr[-2000:]}")
    out = json.loads(html.unescape(m.group(1)))
    out["console"] = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return out


def screenshot(report: str | Path, png: str | Path, width: int = 1400, height: int = 5000) -> None:
    _run(
        [f"--screenshot={png}", f"--window-size={width},{height}",
         "--virtual-time-budget=30000", Path(report).resolve().as_uri()],
        120,
    )  # fmt: skip


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3:
        screenshot(sys.argv[1], sys.argv[2])
    print(json.dumps(probe(sys.argv[1]), indent=1))
