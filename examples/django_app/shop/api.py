"""REST framework views: moderato's throttles (from the settings, and scoped), DRF's own."""

from __future__ import annotations

from typing import Any

from rest_framework import throttling as drf_throttling
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from moderato.django.throttling import ScopedRateThrottle


class StatusView(APIView):
    """DEFAULT_THROTTLE_CLASSES: moderato's AnonRateThrottle and UserRateThrottle."""

    def get(self, request: Request) -> Response:
        return Response({"user": str(request.user)})


class UploadView(APIView):
    """A scoped rate: DEFAULT_THROTTLE_RATES["uploads"], per user (else address)."""

    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "uploads"

    def post(self, request: Request) -> Response:
        return Response({"uploaded": True})


class DrfOwnAnonView(APIView):
    """DRF's own AnonRateThrottle (Django's cache), for comparison under load."""

    throttle_classes = (drf_throttling.AnonRateThrottle,)

    def get(self, request: Request, **_: Any) -> Response:
        return Response({"admitted": True})
