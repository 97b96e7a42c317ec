"""Endpoints named like those in the sibling module."""

from __future__ import annotations

from fastapi import APIRouter

from moderato import RateLimiter


def build(limiter: RateLimiter) -> APIRouter:
    router = APIRouter(prefix="/beta")

    @router.get("/items")
    @limiter.limit("2/hour")
    async def list_items() -> dict[str, str]:
        return {"module": "beta"}

    return router
