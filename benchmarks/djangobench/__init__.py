"""The Django project of benchmarks/django_bench.py (settings and one no-op task)."""
