"""Sharded queues (ledgerq.open_sharded)."""
