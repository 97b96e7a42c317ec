"""A process of blocking checks for the dashboard's fleet test: moderato.sync.RateLimiter in
16 threads, recorded with moderato.dashboard.record(), so its daemon thread publishes.

    python tests/blocking_dashboard_worker.py redis://127.0.0.1:6390 PREFIX

Each thread checks its own identity CHECKS_PER_THREAD times on OWN_RATE (scope "own"),
and every 4th time one identity all threads share on SHARED_RATE (scope "shared"). It
prints ``done <process id>`` when every check is decided, then keeps publishing until
its standard input closes.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from moderato.dashboard import record
from moderato.sync import RateLimiter

THREADS = 16
CHECKS_PER_THREAD = 400
OWN_RATE, OWN_LIMIT = "250/hour", 250
SHARED_RATE, SHARED_LIMIT = "1000/hour", 1000
SHARED_CHECKS = THREADS * CHECKS_PER_THREAD // 4


def main(redis_url: str, prefix: str) -> None:
    limiter = RateLimiter(
        redis_url, key_prefix=prefix, max_connections=THREADS, command_timeout_s=10
    )
    recorder = record(limiter)
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for n in range(CHECKS_PER_THREAD):
            limiter.check_with_info(f"t{thread}", OWN_RATE, scope="own")
            if n % 4 == 0:
                limiter.check_with_info("shared", SHARED_RATE, scope="shared")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, range(THREADS)))
    print("done", recorder.process_id, flush=True)
    sys.stdin.read()  # until the test closes it


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
