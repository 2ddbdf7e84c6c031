"""The Django app ``ledgerq.django`` (``INSTALLED_APPS``): it brings the
``ledgerq_worker`` management command; the backend itself needs no app."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["LedgerQConfig"]


class LedgerQConfig(AppConfig):
    """The app: no models, one management command."""

    name = "ledgerq.django"
    label = "ledgerq"
    verbose_name = "ledgerq tasks"
