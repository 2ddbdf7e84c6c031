"""Benchmarks of ledgerq against its peers; run ``python benchmarks/run.py --help``."""
