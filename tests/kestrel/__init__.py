"""Kestrel journal readers and the importer."""
