"""Every file in examples/ runs, end to end, on a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._child import run_python

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    result = run_python(example, tmp_path / "queue", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "an example should show what it did"
