"""The HTML report: which figures appear for which data, page structure, offline rendering."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
import pytest
import report_browser
import report_synthetic as syn

from kvbench.cli import main
from kvbench.report.figures import frontier, split_memory
from kvbench.report.page import build, current, load, write_report

ALL = ["latency", "formats", "layouts", "tiles", "accuracy", "memory", "residency", "bandwidth"]
ALL += ["roofline"]
ALL += ["history", "compare"]


class Sections(HTMLParser):
    """Collects, per <section class="figure">, its id and the tags inside it."""

    def __init__(self):
        super().__init__()
        self.sections, self.depth, self.scripts = [], 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts.append(a)
        if tag == "section" and a.get("class") == "figure":
            self.sections.append({"id": a["id"], "tags": []})
            self.depth = 1
        elif self.depth:
            self.sections[-1]["tags"].append((tag, a))
            self.depth += tag == "section"

    def handle_endtag(self, tag):
        if self.depth and tag == "section":
            self.depth -= 1


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    out, n = write_report(syn.write(d), d / "report.html")
    return out, out.read_text(encoding="utf-8")


def parse(text: str) -> Sections:
    p = Sections()
    p.feed(text)
    return p


def test_every_figure_appears_when_its_axes_exist(full_report):
    assert [s["id"] for s in parse(full_report[1]).sections] == ALL


def test_each_figure_has_its_plot_and_table(full_report):
    for s in parse(full_report[1]).sections:
        tags = [t for t, _ in s["tags"]]
        ids = [a.get("id") for _, a in s["tags"]]
        assert f"plot-{s['id']}" in ids, s["id"]
        assert "table" in tags and "h2" in tags, s["id"]


def test_self_contained_plotly_inlined(full_report):
    text = full_report[1]
    p = parse(text)
    assert not [a for a in p.scripts if "src" in a], "no script may be fetched"
    assert not re.search(r"<link\b|@import|@font-face|<iframe\b|<img\b", text)
    head = text.split("</head>")[0]
    assert len(head) > 1_000_000 and "plotly.js v" in head  # the whole bundle, inline


def test_figures_follow_the_data(tmp_path):
    df = syn.rows(0)
    plain = df[df["tile_kv"].isna() & (df["n_seqs"] == 1) & (df["kv_dtype"] != "int4")]
    plain.to_csv(tmp_path / "a.csv", index=False)
    ids = [s["id"] for s in parse(build([tmp_path / "a.csv"])).sections]
    assert ids == ["latency", "formats", "accuracy", "memory", "residency", "bandwidth", "roofline"]
    one = plain[plain["kv_dtype"] == "fp16"].assign(bits_per_elem=None, gbps=None, flops=None)
    one.to_csv(tmp_path / "b.csv", index=False)
    ids = [s["id"] for s in parse(build([tmp_path / "b.csv"])).sections]
    assert ids == ["latency", "memory", "residency"]
    one.drop(columns=["resident_bytes"]).to_csv(tmp_path / "b.csv", index=False)  # older rows
    assert [s["id"] for s in parse(build([tmp_path / "b.csv"])).sections] == ["latency", "memory"]


def test_header_context_and_failed_rows(full_report):
    text = full_report[1]
    for want in ("synthetic cpu", "1111111", "0.1.0", "skipped", "ParityError", "Metal backend"):
        assert want in text
    assert "ok: 46, error: 1, skipped: 1, partial: 0" in text


def test_current_takes_newest_row_per_case(tmp_path):
    rows, _ = load(syn.write(tmp_path, compare=False))
    cur = current(rows)
    assert len(cur) == len(syn.rows(0)) and set(cur["run_id"]) == {syn.rows(1)["run_id"][0]}
    assert set(rows["commit"]) == {"0" * 12, "1" * 12}  # digits stay text
    latest = current(rows, latest=True)
    assert set(latest["run_id"]) == set(cur["run_id"])


def test_memory_split_is_exact():
    d = pd.DataFrame(
        {"kv_dtype": ["fp16", "int4", "mystery"], "kv_bytes": [4096, 1152, 100]}
        | {"bits_per_elem": [16.0, 4.5, 3.0]}
    )
    s = split_memory(d)
    assert list(s["scales_bytes"]) == [0, 128, 0]  # int4/g32 fp16 scales: 0.5 of 4.5 bits
    assert list(s["k_bytes"]) == [2048, 512, 50] and list(s["split_known"]) == [1, 1, 0]
    # a recorded data_bits is used: a format the old table never knew splits too
    s = split_memory(d.assign(data_bits=[16, 4, 2]))
    assert list(s["scales_bytes"]) == [0, 128, 33] and list(s["split_known"]) == [1, 1, 1]


def test_memory_split_of_a_policy_row_uses_its_cells_bits():
    """A q4_0 row under snapkv 0.5: bits_per_elem 2.25 is per context element (half the
    cells kept), which would clip the scales' share to 0; its kept cells hold 4.5 bits each,
    0.5 of them the fp16 block scale: 1/9 of the bytes are scales."""
    kept_cells, head_dim = 2 * 3 * 100, 64  # layers x KV heads x cells kept each
    kept = 2 * kept_cells * head_dim * 4.5 / 8  # K and V at q4_0's 4.5 bits
    d = pd.DataFrame({"kv_dtype": ["q4_0"], "kv_bytes": [kept], "bits_per_elem": [2.25],
                      "data_bits": [4], "kept_bytes": [kept], "kept_cells": [kept_cells],
                      "head_dim": [head_dim]})  # fmt: skip
    assert split_memory(d)["scales_bytes"].iloc[0] == round(kept / 9)


def test_frontier_keeps_pareto_points():
    p = pd.DataFrame(
        {"bits_per_elem": [4.5, 4.5, 8.0, 16.0, 32.0], "rel_err": [0.1, 0.2, 0.3, 1e-3, 0]}
    )
    assert list(frontier(p).index) == [0, 3, 4]


def test_cli_report_and_compare_option(tmp_path, capsys):
    df = syn.rows(0)
    df[(df["kv_dtype"] == "fp32") & (df["kernel"] == "sdpa")].to_csv(
        tmp_path / "a.csv", index=False
    )
    cmp = tmp_path / "cmp.txt"
    syn.compare_rows().to_csv(cmp, index=False)
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path), "-o", str(out), "--compare", str(cmp)]) == 0
    # latency, memory, residency, bandwidth, roofline, compare
    assert "(6 figures)" in capsys.readouterr().out
    assert 'id="compare"' in out.read_text()
    assert main(["report", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert main(["report", str(cmp), "-o", str(out)]) == 0  # a compare table alone
    assert "(1 figure)" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "-o", str(out)]) == 2


@pytest.mark.skipif(
    report_browser.chromium() is None,
    reason="chromium not installed (apt-get install -y chromium); .ci/run installs it",
)
def test_every_figure_renders_in_headless_chromium(full_report):
    got = report_browser.probe(full_report[0])
    assert got["errors"] == [] and got["console"] == [], got
    assert got["plots"] == got["drawn"] == len(ALL), got
    assert got["plotly"] and got["svgs"] >= len(ALL)


def test_layout_memory_uses_cell_bytes_when_present(full_report):
    text = full_report[1]
    assert "Memory: bytes_alloc (cells allocated" in text


def test_log_ticks_label_full_numbers():
    from kvbench.report.common import log_ticks

    t = log_ticks([0.19, 7.0])
    assert t["tickvals"][:3] == [0.2, 0.5, 1.0] and t["ticktext"][:3] == ["0.2", "0.5", "1"]
    assert log_ticks([1.0, 1.5]) == {}  # under 2x: plotly's own ticks
    assert log_ticks([1e-6, 1.0])["ticktext"] == [
        "1e-06",
        "1e-05",
        "0.0001",
        "0.001",
        "0.01",
        "0.1",
        "1",
    ]


def test_many_memory_panels_fit(tmp_path):
    # 13 distinct formats x layouts give a memory grid of 4 rows or more; plotly refuses a row
    # gap above 1/(rows-1), which a fixed gap broke on a real quant+streams+tiles report
    df = syn.rows(0)
    base = df[df["tile_kv"].isna() & (df["n_seqs"] == 1)].iloc[:1]
    many = pd.concat(
        [base.assign(kv_dtype=f"fmt{i}", case_id=f"c{i}", bits_per_elem=4 + i) for i in range(40)]
    )
    many.to_csv(tmp_path / "m.csv", index=False)
    assert "memory" in [s["id"] for s in parse(build([tmp_path / "m.csv"])).sections]


def test_peer_ratio_figure(tmp_path):
    df = syn.rows(0)
    ours = df[df["tile_kv"].isna() & (df["n_seqs"] == 1) & (df["kv_dtype"] == "fp16")]
    ours = ours[ours["kernel"] == ours["kernel"].iloc[0]]
    peer = ours.assign(
        kernel="mlx_lm", median_ms=ours["median_ms"] * 2, case_id=ours["case_id"] + "p"
    )
    pd.concat([ours, peer]).to_csv(tmp_path / "p.csv", index=False)
    sections = parse(build([tmp_path / "p.csv"])).sections
    assert "peers" in [s["id"] for s in sections]
    from kvbench.analysis.peers_summary import peer_ratios

    assert peer_ratios(pd.concat([ours, peer]))["ratio"].round(9).eq(0.5).all()


def test_history_keeps_one_line_per_device(tmp_path):
    from kvbench.report.views import history_fig

    syn.rows(0).to_csv(tmp_path / "a.csv", index=False)
    syn.rows(1).assign(device="NVIDIA H100 (cuda)").to_csv(tmp_path / "b.csv", index=False)
    syn.rows(1).to_csv(tmp_path / "c.csv", index=False)
    mixed, _ = load([tmp_path / "a.csv", tmp_path / "b.csv"])
    fig = history_fig(mixed, list(dict.fromkeys(mixed["run_id"])))
    assert fig is None or all("@" in c for c in fig.table["case"])  # never one mixed line
    same, _ = load([tmp_path / "a.csv", tmp_path / "c.csv"])
    fig = history_fig(same, list(dict.fromkeys(same["run_id"])))
    assert fig is not None and not any("@" in c for c in fig.table["case"])


def test_quality_points_keep_kvbench_and_llama_cpp_apart_with_their_pareto_frontier():
    from kvbench.report.common import pareto
    from kvbench.report.ratios import quality, quality_points

    def q(kernel, fmt, bits, kl):
        return dict(status="ok", phase="quality", group_size=32.0, kernel=kernel, kv_dtype=fmt,
                    bits_per_elem=bits, kl_mean=kl, delta_ppl=kl, tokens_per_s=None)  # fmt: skip

    rows = pd.DataFrame(
        [
            q("reference", "int8", 8.5, 4e-4),
            q("reference", "int4", 4.5, 0.16),
            q("llama.cpp", "int4", 4.5, 0.05),
            q("reference", "affine4", 5.0, 0.2),
            dict(status="ok", phase="model_decode", kernel="llama.cpp", kv_dtype="int4",
                 group_size=32.0, tokens_per_s=55.0),
        ]
    )  # fmt: skip
    pts = quality_points(rows)
    assert sorted(pts["source"].unique()) == ["kvbench", "llama.cpp"]
    kv = pts[pts["source"] == "kvbench"]
    # affine4 (5.0 bits, KL 0.2) is beaten by int4 (4.5 bits, KL 0.16): off the frontier
    assert list(pareto(kv, "bits_per_elem", "kl_mean")["kl_mean"]) == [0.16, 4e-4]
    assert pts.loc[pts["source"] == "llama.cpp", "tokens_per_s"].iloc[0] == 55.0
    assert quality(rows) is not None


def _title_geometry(fig):
    """(rows of subplot titles' y, the smallest gap in px between panel rows, title lines)."""
    from kvbench.report.common import LEGEND_PX, PAGE_PLOT_PX, TITLE_CHAR_PX

    titles = [a for a in fig.layout.annotations if a.yanchor == "bottom" and a.yref == "paper"]
    ncol = len({round(a.x, 3) for a in titles})
    width_chars = (PAGE_PLOT_PX - LEGEND_PX) / ncol / TITLE_CHAR_PX
    assert all(a.font.size is None or a.font.size <= 12 for a in titles)
    domains = sorted({tuple(fig.layout[k].domain) for k in fig.layout if k.startswith("yaxis")
                      and fig.layout[k].domain}, reverse=True)  # fmt: skip
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    gap_px = min(up[0] - low[1] for up, low in zip(domains, domains[1:])) * plot_px
    lines = max(a.text.count("<br>") + 1 for a in titles)
    longest = max(len(line) for a in titles for line in a.text.split("<br>"))
    return gap_px, lines, longest, width_chars


@pytest.mark.parametrize("n", [5, 25])
def test_memory_panel_titles_never_overlap(n):
    """#44 item 3: at 25 formats (and a few) every subplot title fits its panel's width and the
    gap between panel rows holds the title's lines and the tick labels of the row above."""
    from kvbench.report.figures import memory

    df = syn.rows(0)
    base = df[df["tile_kv"].isna() & (df["n_seqs"] == 1)].iloc[:1]
    # every cache axis varies: the longest series names a run gives (a truth-like suite's)
    many = pd.concat([base.assign(
        kv_dtype=f"fmt{i}", case_id=f"c{i}", bits_per_elem=4 + i,
        rotate_k=["none", "hadamard"][i % 2], rotate_v=["none", "hadamard"][i // 2 % 2],
        q_quant=["none", "q8_0"][i // 4 % 2], k_order=["hf", "gguf"][i // 8 % 2],
        rot_block_k=[32, 64][i % 2], rot_block_v=[32, 64][i // 2 % 2], sink_tokens=i % 3,
    ) for i in range(n)])  # fmt: skip
    fig = memory(many).fig
    gap_px, lines, longest, width_chars = _title_geometry(fig)
    assert longest <= width_chars
    assert gap_px >= lines * 16 + 30, (gap_px, lines)
    assert fig.layout.margin.t >= lines * 16


def test_quality_figure_names_points_and_only_present_systems():
    """#44 item 3: figure 1 on kvbench's quality rows alone: every point named, no llama.cpp in
    the title, no empty decode panel (said in the note); the memory legend has no series the
    rows lack (quality rows measure no allocation or peak)."""
    from kvbench.report.figures import memory
    from kvbench.report.page import normalize
    from kvbench.report.ratios import quality

    d = pd.read_csv("docs/data/truth-smollm2-2k.csv")
    d = normalize(d[d["kernel"] == "reference"])
    f = quality(d)
    assert "llama.cpp" not in f.title and "decode" not in f.title
    assert "No decode-speed panel" in f.note
    assert len([a for a in f.fig.layout.annotations if a.yanchor == "bottom"]) == 2
    points = [t for t in f.fig.data if t.mode == "markers+text"]
    assert points and all(len(t.text) == len(t.x) for t in points)
    named = {x for t in points for x in t.text}
    assert any("hadamard" in x for x in named) and len(named) == 5
    legend = {t.name for t in memory(d).fig.data if t.showlegend}
    assert legend == {"K data", "V data", "scales (K+V)"}
