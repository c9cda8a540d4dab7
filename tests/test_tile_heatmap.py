"""tile_heatmap: result rows -> tile x context table (pandas only)."""

import pandas as pd

from kvbench.analysis.summary import tile_heatmap


def test_pivot_keeps_ok_rows_one_column_per_tile():
    rows = [
        dict(
            status="ok",
            kernel="tiled",
            kv_dtype="fp16",
            gqa_ratio=4,
            context_len=c,
            tile_kv=t,
            median_ms=c / t,
        )
        for c in (256, 1024)
        for t in (16, 32)
    ]
    rows.append(
        dict(
            status="skipped",
            kernel="metal",
            kv_dtype="fp16",
            gqa_ratio=4,
            context_len=256,
            tile_kv=16,
            median_ms=None,
        )
    )
    table = tile_heatmap(pd.DataFrame(rows))
    assert list(table.columns) == [16, 32]
    assert table.loc[("tiled", "fp16", 4, 1024), 16] == 64
    assert len(table) == 2
