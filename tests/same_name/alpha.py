"""Endpoints named like those in the sibling module."""

from __future__ import annotations

from fastapi import APIRouter

from moderato import RateLimiter


def build(limiter: RateLimiter) -> APIRouter:
    router = APIRouter(prefix="/alpha")

    @router.get("/items")
    @limiter.limit("2/hour")
    async def list_items() -> dict[str, str]:
        return {"module": "alpha"}

    return router
