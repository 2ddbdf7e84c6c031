"""Shipping a queue to a hub directory (ledgerq.ship)."""
