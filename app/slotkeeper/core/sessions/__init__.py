"""Saved sessions: sidecars, the store, lineage and the disk budget."""
