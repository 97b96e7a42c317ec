"""A first look: a few checks against Redis, printed as they are decided.

Run with `make quickstart`. Uses MODERATO_REDIS_URL (default redis://localhost:6379).
"""

from __future__ import annotations

import asyncio
import os

from moderato import RateLimiter

REDIS_URL = os.environ.get("MODERATO_REDIS_URL", "redis://localhost:6379")


async def main() -> None:
    async with RateLimiter(REDIS_URL, key_prefix="moderato-demo") as limiter:
        # With the rate and the scope, reset knows the keys exactly: one script call, no SCAN.
        await limiter.reset("demo-user", rate="5/minute;20/hour", scope="global")
        print(f"backend: {REDIS_URL}")
        print("rate 5/minute;20/hour, cost 1, then one request of cost 3")
        for attempt in range(1, 8):
            cost = 3 if attempt == 7 else 1
            result = await limiter.check_with_info("demo-user", "5/minute;20/hour", cost=cost)
            verdict = "allowed" if result.allowed else f"denied (retry in {result.retry_after} s)"
            print(
                f"  #{attempt} cost={cost}: {verdict:<24} remaining={result.remaining} "
                f"of {result.limit}/{result.window_seconds}s"
            )
        usage = await limiter.get_usage("demo-user", "5/minute")
        print(f"usage of 5/minute: current={usage['current']} remaining={usage['remaining']}")
        huge = await limiter.check_with_info("demo-user", "5/minute", cost=6)
        print(
            f"cost 6 on 5/minute: allowed={huge.allowed} retry_after={huge.retry_after} "
            "(permanent: waiting cannot help)"
        )


if __name__ == "__main__":
    asyncio.run(main())
