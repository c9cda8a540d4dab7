"""`kvbench report results/ -o site/`: a results directory as a small offline site.

index.html lists every run (suite, commit, device, date, row counts) and links one page per
suite (suite-<name>.html: that suite's current rows, findings first, every figure) and, for a
suite measured in more than one run, its history page (history-<name>.html). plotly.js is
written once beside the pages (plotly.min.js) and loaded by a relative path, so the site opens
offline from disk; a single-run page (`-o x.html`) stays one self-contained file.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
from plotly.offline import get_plotlyjs

from kvbench.errors import UserError
from kvbench.report.html import CSS, STATUSES, html_table
from kvbench.report.page import current, load, run_order

PLOTLY_FILE = "plotly.min.js"


def slug(name) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)).strip("-") or "unnamed"


def runs_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per run, newest first: what index.html lists."""
    out = []
    for run in reversed(run_order(rows)):
        r = rows[rows["run_id"] == run]
        first, counts = r.iloc[0], r["status"].value_counts()
        out.append({
            "run": run, "suite": first["suite"],
            "commit": str(first["commit"])[:12] + (" (dirty)" if first["dirty"] is True else ""),
            "device": first["device"], "backend": first["backend"],
            "date (UTC)": str(first["timestamp"])[:16].replace("T", " "), "rows": len(r),
            **{s: int(counts.get(s, 0)) for s in STATUSES},
        })  # fmt: skip
    return pd.DataFrame(out)


def _suite_page(rows: pd.DataFrame, suite: str, history_only: bool) -> str:
    from kvbench.analysis.findings import findings
    from kvbench.report.figures import all_figures
    from kvbench.report.html import page
    from kvbench.report.views import history_fig

    cur = current(rows)
    if history_only:
        figs = [f for f in [history_fig(rows, run_order(rows))] if f is not None]
        return page(cur, figs, title=f"kvbench history: {suite}", script_src=PLOTLY_FILE)
    figs = all_figures(cur, rows, None, run_order(rows))
    return page(cur, figs, title=f"kvbench: {suite}", found=findings(cur), script_src=PLOTLY_FILE)


def _index(rows: pd.DataFrame, pages: dict) -> str:
    t = runs_table(rows)
    table = html_table(t)
    for s, (p, _) in pages.items():  # the suite cell links to its page
        cell = f'<td class="text">{html.escape(str(s))}</td>'
        table = table.replace(
            cell, f'<td class="text"><a href="{p}">{html.escape(str(s))}</a></td>'
        )
    items = "".join(
        f'<li><a href="{p}">{html.escape(str(s))}</a>'
        + (f' · <a href="{h}">history</a>' if h else "")
        + "</li>"
        for s, (p, h) in pages.items()
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>kvbench results</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>kvbench results</h1>\n<h2>Suites</h2><ul>{items}</ul>\n"
        f"<h2>Runs ({len(t)})</h2>\n{table}\n</body>\n</html>\n"
    )


def write_site(paths, out: str | Path) -> tuple[Path, int]:
    """Write index.html, a page per suite and history pages under `out`; (index, pages)."""
    rows, _ = load(paths)
    if rows.empty:
        raise UserError(f"{' '.join(map(str, paths))}: no result rows found")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / PLOTLY_FILE).write_text(get_plotlyjs(), encoding="utf-8")
    rows = rows.assign(suite=rows["suite"].fillna("unnamed"))
    pages = {}
    for suite, r in rows.groupby("suite", sort=True):
        page_name = f"suite-{slug(suite)}.html"
        (out / page_name).write_text(_suite_page(r, suite, False), encoding="utf-8")
        hist = None
        if r["run_id"].nunique() > 1:
            hist = f"history-{slug(suite)}.html"
            (out / hist).write_text(_suite_page(r, suite, True), encoding="utf-8")
        pages[suite] = (page_name, hist)
    (out / "index.html").write_text(_index(rows, pages), encoding="utf-8")
    return out / "index.html", 1 + sum(1 + (h is not None) for _, h in pages.values())
