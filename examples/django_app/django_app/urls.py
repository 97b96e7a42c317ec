"""The example's URLs: function views (sync and async), class-based views, DRF views."""

from __future__ import annotations

from django.urls import path
from shop import api, views

urlpatterns = [
    path("healthz", views.healthz),
    path("hello/", views.hello),
    path("hello-async/", views.hello_async),
    path("items/<int:pk>/", views.item),
    path("search/", views.search),
    path("shared/", views.shared_sync),
    path("shared-async/", views.shared_async),
    path("reports/", views.ReportView.as_view()),
    path("reports-async/", views.AsyncReportView.as_view()),
    *views.ten_per_minute_routes(),
    path("api/status/", api.StatusView.as_view()),
    path("api/uploads/", api.UploadView.as_view()),
    path("api/drf-anon/", api.DrfOwnAnonView.as_view()),
]
