"""`kvbench list` and `kvbench env` (harness/run/inventory.py): every peer kernel listed, memory
and peer readiness shown (issue 44 item 7)."""

from __future__ import annotations

from kvbench.peers.registry import PEERS
from kvbench.run import inventory


def test_list_names_every_peer_kernel_llama_cpp_included():
    text = inventory.inventory()
    peers = text.split("peer kernels")[1].split("kv data:")[0]
    for name in [*PEERS, "llama.cpp"]:
        assert f"\n  {name} " in peers, name


def test_llama_cpp_line_says_its_formats_or_why_not(monkeypatch):
    from kvbench.peers import llamacpp

    monkeypatch.setattr(llamacpp, "missing_reason", lambda name: None)
    assert "q8_0" in inventory.llamacpp_line() and "int4" not in inventory.llamacpp_line()
    monkeypatch.setattr(llamacpp, "missing_reason", lambda name: "llama.cpp not built: x")
    assert inventory.llamacpp_line() == "llama.cpp not built: x"
    assert inventory.peer_states()["llama.cpp"] == "llama.cpp not built: x"


def test_memory_line_reads_total_and_available(monkeypatch):
    import kvbench.run.memory as m

    monkeypatch.setattr(m, "available_bytes", lambda: (3 * 2**30, "MemAvailable in /proc/meminfo"))
    line = inventory.memory_line()
    assert line.endswith("3.0 GiB available (MemAvailable in /proc/meminfo)")
