"""Redis µs per batched call of 8 and 16 checks, every check but the first denied
(batch_bound.run with a limit of 1), for four algorithms.

    python others_denied.py <tree>
"""

import json
import sys
from pathlib import Path

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from batch_bound import run  # noqa: E402

out = {}
for name in ("token_bucket", "sliding_window", "gcra", "sliding_log"):
    for parts in (8, 16):
        out[f"{name}, {parts} checks, limit 1 (denied)"] = run(name, 1, parts, limit=1)
print(json.dumps(out, indent=1))
