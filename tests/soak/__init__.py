"""Soak test of ``ledgerq serve``: honest and abusive clients against one real server process.

``python -m tests.soak --seconds 300`` runs the long version; ``test_soak.py`` a short
one.  See docs/reliability.md, "Server soak".
"""
