"""Fixtures: one shared server per module (tests use their own queue names), and names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server._harness import Raw, ServerProcess, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = yield from serving(tmp_path_factory, "serve", "--max-open-reads", "1")
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Raw]:
    with server.client() as raw:
        yield raw


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name of this test's own (the module's server is shared)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[-100:]


@pytest.fixture
def data_dir(server: ServerProcess) -> Path:
    return server.data_dir
