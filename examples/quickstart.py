"""A first look: a few checks of the manual API, printed as they are decided.

Run with `make quickstart` or `python examples/quickstart.py`. The backend:
MODERATO_REDIS_URL when set, else the Redis on localhost:6379 when one answers
there, else memory:// (examples/backend_choice.py); the first line says which.
"""

from __future__ import annotations

import asyncio

from moderato import RateLimiter

try:  # `python -m examples.quickstart`, from the repository's root
    from examples.backend_choice import backend_url
except ModuleNotFoundError:  # `python examples/quickstart.py`: its own folder is on the path
    from backend_choice import backend_url


async def main() -> None:
    async with RateLimiter(backend_url("quickstart"), key_prefix="moderato-demo") as limiter:
        # With the rate and the scope, reset knows the keys exactly: one script call, no SCAN.
        await limiter.reset("demo-user", rate="5/minute;20/hour", scope="global")
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
