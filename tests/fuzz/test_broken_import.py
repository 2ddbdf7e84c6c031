"""A module of ledgerq's own that fails to import fails the fuzz run; it never skips.

The fuzz targets once skipped any target whose module did not import (written while
the memcache protocol and the Kestrel readers did not exist yet), so a broken import
of ledgerq's own code passed the suite as "skipped".  Each case below runs pytest on
the fuzz tests in a child process in which one module under fuzzing cannot be
imported, and expects a failure that names it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# ``sys.modules[name] = None`` makes ``import name`` raise ImportError, as a module that
# was renamed, moved or broken would.
_BREAK_AND_RUN = """
import sys
import pytest
sys.modules[sys.argv[1]] = None
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/fuzz/test_fuzz.py",
                      "-k", "test_seed_corpus and " + sys.argv[2]]))
"""


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("ledgerq.server.protocol", "memcache"),
        ("ledgerq.kestrel.journal3", "kestrel3"),
        ("ledgerq.kestrel.oldjournal", "kestrel_old"),
        ("ledgerq.features.dlq.retries", "retry_file"),
    ],
)
def test_a_target_whose_module_does_not_import_fails(module: str, target: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _BREAK_AND_RUN, module, target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode not in (0, 5), f"a broken {module} did not fail the run:\n{output}"
    assert "skipped" not in output, output
    assert module in output, f"the failure does not name {module}:\n{output}"
