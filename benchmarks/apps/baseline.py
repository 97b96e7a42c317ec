"""The app with no rate limiter: the ceiling every limited app is measured against."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from benchmarks.apps import BODY

app = FastAPI()


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed")
async def allowed() -> dict[str, Any]:
    return BODY


@app.get("/limited")
async def limited() -> dict[str, Any]:
    return BODY  # nothing limits it: shown for reference only
