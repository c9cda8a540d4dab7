"""Compile gates for the Metal and CUDA kernels, without a GPU (tests/test_compile_gates.py,
docs/kernels.md). Helpers only: pytest collects no tests here."""
