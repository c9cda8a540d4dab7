"""kvbench's instrument: suites, cases, timing, metrics, records, compare and report."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
