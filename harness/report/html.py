"""The report page: header (runs, context, status counts, failed rows) and figure sections.

Self-contained: plotly.js is inlined once in <head>, styles are inline, no fonts or scripts are
fetched. Each figure is a <section class="figure"> holding its plot, a note on how it is
computed, and a table of the numbers plotted.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from kvbench.analysis.findings import Finding
from kvbench.report.common import Figure
from kvbench.store.status import STATUSES

OPEN_ROWS = 12  # longer tables start folded (still in the page; a click opens them)
CONFIG = {"displaylogo": False, "responsive": True}
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #222; max-width: 1400px; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.note { color: #555; font-size: 14px; max-width: 1100px; }
.bad { color: #b00; } details { margin: 6px 0 20px; } summary { cursor: pointer; }
.meta td { text-align: left; }
.findings li { margin: 3px 0; font-size: 15px; } .findings .topic { color: #555; }
.findings .none { color: #777; } .findings a { white-space: nowrap; }
pre.answer { background: #f7f7f2; border: 1px solid #ddd; padding: 8px 12px; font-size: 13px;
             overflow-x: auto; white-space: pre; }
"""
SHOWN_FINDINGS = 8  # per topic; the rest fold under a click


def cell(v) -> str:
    """One table cell's text: 4 significant digits for floats, blank for missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"
    return str(v)


def html_table(df: pd.DataFrame, cls: str = "") -> str:
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) for c in df.columns}
    head = "".join(
        f'<th class="{"" if numeric[c] else "text"}">{html.escape(str(c))}</th>' for c in df
    )
    body = []
    for row in df.itertuples(index=False):
        tds = "".join(
            f'<td class="{"" if numeric[c] else "text"}">{html.escape(cell(v))}</td>'
            for c, v in zip(df.columns, row)
        )
        body.append(f"<tr>{tds}</tr>")
    return f'<table class="{cls}"><tr>{head}</tr>{"".join(body)}</table>'


def _runs(cur: pd.DataFrame) -> pd.DataFrame:
    out = []
    for run, r in cur.groupby("run_id", sort=False, dropna=False):
        first = r.iloc[0]
        counts = r["status"].value_counts()
        out.append(
            {
                "run": run,
                "suite": first["suite"],
                "commit": str(first["commit"])[:12]
                + (" (dirty)" if first["dirty"] is True else ""),
                "branch": first["branch"],
                "date (UTC)": first["timestamp"],
                "device": first["device"],
                "backend": first["backend"],
                "mlx": first["mlx_version"],
                "BLAS": first["blas"],
                "BLAS fp32 (GFLOP/s)": first["blas_gflops"],
                "kvbench": first["kvbench_version"],
                "measured peak (GB/s)": first["peak_gbps"],
                "peak method": first["peak_method"],
                "host": first["host"],
                "rows": len(r),
                **{s: int(counts.get(s, 0)) for s in STATUSES},
            }
        )
    return pd.DataFrame(out)


def _finding(f: Finding, titles: dict) -> str:
    cls = "finding" if f.supported else "finding none"
    link = f'<a href="#{f.figure}" title="{html.escape(titles[f.figure])}">→ figure</a>'
    return f'<li class="{cls}">{html.escape(f.text)} {link}</li>'


def findings_html(found: list[Finding], figures: list[Figure]) -> str:
    """The findings, grouped by topic, each line linking to its figure (first thing shown)."""
    titles = {f.key: f.title for f in figures}
    found = [f for f in found if f.figure in titles]  # a finding is shown beside its figure
    if not found:
        return '<p class="note">No finding: the rows hold no comparison a finding needs.</p>'
    parts = ['<h2 id="findings">Findings</h2><ul class="findings">']
    for topic in dict.fromkeys(f.topic for f in found):
        lines = [_finding(f, titles) for f in found if f.topic == topic]
        more = ""
        if len(lines) > SHOWN_FINDINGS:
            more = (f"<details><summary>{len(lines) - SHOWN_FINDINGS} more</summary><ul>"
                    f"{''.join(lines[SHOWN_FINDINGS:])}</ul></details>")  # fmt: skip
        parts.append(f'<li><span class="topic">{html.escape(topic)}</span><ul>'
                     f"{''.join(lines[:SHOWN_FINDINGS])}</ul>{more}</li>")  # fmt: skip
    parts.append("</ul>")
    parts.append(
        '<p class="note">A difference is stated only when the interval of the ratio of medians '
        "(from both sides' 95% CIs of the median) lies wholly beyond 1.1×; otherwise the line "
        "says no difference measured (harness/analysis/findings/).</p>"
    )
    return "".join(parts)


def interrupted_html(cur: pd.DataFrame) -> str:
    """A line saying the run was interrupted, when rows say so (session.py: partial rows, and
    skipped rows for the cases not measured)."""
    error = cur["error"].astype(object).where(cur["error"].notna(), "").astype(str)
    partial = int(error.str.startswith("interrupted after").sum())
    left_out = int(error.str.startswith("not measured: the run was interrupted").sum())
    if not partial and not left_out:
        return ""
    return (
        f'<p class="bad">Interrupted run: {partial} cases measured in only some of their rounds '
        f"(partial), {left_out} cases not measured at all; their figures are missing or rest "
        "on fewer samples.</p>"
    )


def answer_html(cur: pd.DataFrame) -> str:
    """The answer of the quality rows first (analysis/answer.py, as `kvbench run` prints it):
    the baseline, each configuration's error bars, bytes and share of fp16's, the pick."""
    from kvbench.analysis.answer import answer

    text = answer(cur) if len(cur) else ""
    if not text:
        return ""
    return f'<h2>Answer</h2>\n<pre class="answer">{html.escape(text)}</pre>'


def header(cur: pd.DataFrame, figures: list[Figure], title: str, found=()) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counts = cur["status"].value_counts()
    status = ", ".join(f"{s}: {int(counts.get(s, 0))}" for s in STATUSES)
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">Generated {now} by kvbench report. {len(cur)} rows ({status}).</p>',
        interrupted_html(cur),
        answer_html(cur),
        findings_html(list(found), figures),
    ]
    if len(cur):
        parts += ["<h2>Runs</h2>", html_table(_runs(cur), "meta")]
    failed = cur[~cur["status"].isin(("ok",))]
    if len(failed):
        t = failed[["label", "case_id", "status", "error"]].rename(
            columns={"label": "case", "error": "reason"}
        )
        fold = "" if len(t) > OPEN_ROWS else " open"
        parts += [
            f'<h2 class="bad">Rows without a full measurement ({len(failed)})</h2>',
            f"<details{fold}><summary>{len(t)} rows</summary>{html_table(t, 'failed')}</details>",
        ]
    if figures:
        links = "".join(f'<li><a href="#{f.key}">{html.escape(f.title)}</a></li>' for f in figures)
        parts += ["<h2>Figures</h2>", f"<ol>{links}</ol>"]
    else:
        parts.append('<p class="note">No figure: the rows hold no axis a figure needs.</p>')
    return "\n".join(parts)


def section(f: Figure) -> str:
    plot = pio.to_html(
        f.fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{f.key}", config=CONFIG
    )
    fold = "" if len(f.table) > OPEN_ROWS else " open"
    return (
        f'<section class="figure" id="{f.key}">\n<h2>{html.escape(f.title)}</h2>\n{plot}\n'
        f'<p class="note">{html.escape(f.note)}</p>\n'
        f"<details{fold}><summary>Numbers ({len(f.table)} rows)</summary>\n"
        f"{html_table(f.table, 'numbers')}\n</details>\n</section>"
    )


def page(
    cur: pd.DataFrame, figures: list[Figure], title: str | None = None, found=(), script_src=None
) -> str:
    """The page; plotly.js inlined, or loaded from `script_src` (a relative path: a site's
    pages share one copy)."""
    if title is None:
        suites = ", ".join(sorted(map(str, cur["suite"].dropna().unique()))) or "results"
        title = f"kvbench report: {suites}"
    body = header(cur, figures, title, found) + "\n" + "\n".join(section(f) for f in figures)
    script = (
        f'<script src="{script_src}"></script>'
        if script_src
        else f'<script type="text/javascript">{get_plotlyjs()}</script>'
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n{script}\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
