"""pytest-benchmark tests: skipped by the normal test run (they time, they do not check).

`make bench-pytest` sets KVBENCH_BENCH=1 to collect them; without it pytest ignores this folder.
"""

import os

collect_ignore_glob = [] if os.environ.get("KVBENCH_BENCH") == "1" else ["test_*.py"]
