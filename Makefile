# ledgerq developer entry points.  `make demo` and `make test` work on a fresh machine:
# they create .venv when it is missing and install the package into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ledgerq needs Python >= 3.11 (found " + sys.version.split()[0] + "); set PYTHON=python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,ui,celery,django]'
	@touch $(STAMP)

demo: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  echo "== examples/quickstart.py" && $(PY) examples/quickstart.py "$$tmp/jobs" && \
	  echo "== examples/worker_pipeline.py" && $(PY) examples/worker_pipeline.py "$$tmp/images"

test: $(STAMP)
	@command -v java >/dev/null 2>&1 || echo "note: Java 17+ was not found; the Spark tests will be skipped (install a JDK 17 to run them)"
	@test -x /usr/bin/chromium || echo "note: /usr/bin/chromium was not found; the browser tests of ledgerq ui will be skipped (apt-get install chromium)"
	@# Bytecode once, up front: where PYTHONDONTWRITEBYTECODE is set (it is on these
	@# machines), each of the suite's thousands of child processes - CLI calls, workers,
	@# Spark's Python workers - would otherwise compile ledgerq from source (~0.2 s each).
	@$(PY) -m compileall -q -j 0 ledgerq tests examples >/dev/null
	$(PY) -m pytest -q -n 4 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check ledgerq tests examples benchmarks
	$(VENV)/bin/ruff format --check ledgerq tests examples benchmarks
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format ledgerq tests examples benchmarks
	$(VENV)/bin/ruff check --fix ledgerq tests examples benchmarks

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/run.py --write docs/benchmarks.md --json docs/benchmarks.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
