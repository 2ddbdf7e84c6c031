"""``examples/django_project`` runs end to end (tests/test_examples.py runs the examples
that are one file; this one is a project)."""

from __future__ import annotations

from pathlib import Path

from tests._child import REPO, child_environment, run_python

DEMO = REPO / "examples" / "django_project" / "demo.py"


def test_the_django_example_project_runs(tmp_path: Path) -> None:
    env = child_environment()
    env.pop("DJANGO_SETTINGS_MODULE", None)  # the example names its own
    done = run_python(DEMO, tmp_path / "tasks", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "charge: 'charged order 1001: 25.99' (attempts 1)" in done.stdout
    assert "report: 'report for monday (attempt 1)'" in done.stdout
    assert "refund: FAILED with builtins.RuntimeError" in done.stdout
    assert "worker stopped (exit code 0)" in done.stdout
