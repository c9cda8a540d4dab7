"""Stores room: the cache structures and layouts that hold encoded K/V.

cache.py (KVStore, KVCache: the full cache, one stream), layouts.py (unified and per-stream
streams of many sequences), paged.py (block table), window.py (ring window with sinks),
edits.py (shift, self-extend, defrag of a unified store), workloads.py (the sequence mixes).
"""
