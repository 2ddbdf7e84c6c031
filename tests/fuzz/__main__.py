"""Long fuzz runs, and the seed corpus.

    python -m tests.fuzz --examples 20000                 # hypothesis, every target
    python -m tests.fuzz --examples 20000 --target entry  # one target
    python -m tests.fuzz --engine atheris --target entry --examples 200000
    python -m tests.fuzz --make-corpus                    # rewrite tests/fuzz/corpus/

The hypothesis engine runs random (not derandomized) examples with the memory check;
``--engine atheris`` (coverage-guided libFuzzer; ``pip install atheris``, which has
wheels for CPython 3.11 on Linux x86-64) runs one target per process, from a copy of its
seeds, with libFuzzer's RSS limit instead of the per-input memory check.  Inputs that
hit a known bug (test_fuzz.py) are skipped so a run goes on past them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _hypothesis(targets: list[str], examples: int) -> int:
    from tests.faults._shim import quiet_ledgerq
    from tests.fuzz._targets import executions, scratch_cleanup
    from tests.fuzz.test_fuzz import fuzzer

    failed = 0
    for name in targets:
        before, started = executions(), time.monotonic()
        try:
            with quiet_ledgerq():
                fuzzer(name, examples, derandomize=False)()
            status = "ok"
        except Exception as exc:
            failed += 1
            status = f"FAILED: {type(exc).__name__}: {exc}"
        runs = executions() - before
        print(f"{name}: {runs} executions in {time.monotonic() - started:.0f} s: {status}")
    scratch_cleanup()
    return 1 if failed else 0


def _atheris_child(name: str, runs: int, corpus: str) -> None:
    import atheris

    with atheris.instrument_imports(include=["ledgerq"]):
        from tests.fuzz._targets import run_target
        from tests.fuzz.test_fuzz import KNOWN_BUGS

    def one(data: bytes) -> None:
        if not any(bug(name, data) for bug in KNOWN_BUGS):
            run_target(name, data, measure=False)

    atheris.Setup([sys.argv[0], f"-runs={runs}", "-rss_limit_mb=2048", corpus], one)
    atheris.Fuzz()


def _atheris(targets: list[str], examples: int) -> int:
    from tests.fuzz import _corpus

    failed = 0
    for name in targets:
        with tempfile.TemporaryDirectory(prefix=f"ledgerq-atheris-{name}-") as corpus:
            for n, seed in enumerate(_corpus.load(name)):
                Path(corpus, f"seed{n}").write_bytes(seed)
            started = time.monotonic()
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tests.fuzz",
                    "--atheris-child",
                    name,
                    str(examples),
                    corpus,
                ],
                check=False,
            )
            print(
                f"{name}: atheris {examples} runs in {time.monotonic() - started:.0f} s: "
                f"exit {result.returncode}"
            )
            failed += result.returncode != 0
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--atheris-child"]:
        # Before anything imports ledgerq: atheris instruments it as it is imported.
        name, runs, corpus = argv[1:4]
        _atheris_child(name, int(runs), corpus)
        return 0
    from tests.fuzz._targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--examples", type=int, default=5000, help="inputs per target")
    parser.add_argument("--target", choices=sorted(TARGETS), action="append")
    parser.add_argument("--engine", choices=("hypothesis", "atheris"), default="hypothesis")
    parser.add_argument("--make-corpus", action="store_true", help="rewrite the seed corpus")
    args = parser.parse_args(argv)
    if args.make_corpus:
        from tests.fuzz import _corpus

        shutil.rmtree(_corpus.CORPUS, ignore_errors=True)
        print(f"wrote {_corpus.write()} seeds to {_corpus.CORPUS}")
        return 0
    targets = args.target or sorted(TARGETS)
    if args.engine == "atheris":
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed: pip install atheris", file=sys.stderr)
            return 2
        return _atheris(targets, args.examples)
    return _hypothesis(targets, args.examples)


if __name__ == "__main__":
    sys.exit(main())
