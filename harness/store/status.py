"""A row's status values, declared once (no dependencies: store/, analysis/ and report/ read
them). ok: measured; partial: measured, but the run stopped before its planned rounds; error:
failed (the note says why); skipped: not run (the note says why)."""

STATUSES = ("ok", "error", "skipped", "partial")
MEASURED = ("ok", "partial")  # statuses whose rows carry times
