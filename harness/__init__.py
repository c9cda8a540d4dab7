"""kvbench's instrument: suites, cases, timing, metrics, records, compare and report."""

__version__ = "0.1.0"
# 2: data_bits and kernel_kind recorded per row (harness/store/migrate_v1.py fills v1 rows)
SCHEMA_VERSION = 2
