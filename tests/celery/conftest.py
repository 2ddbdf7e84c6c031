"""The Celery tests need ``ledgerq[celery]``; without it they are skipped, saying so."""

from __future__ import annotations

import pytest

pytest.importorskip("celery", reason="ledgerq[celery] is not installed")
