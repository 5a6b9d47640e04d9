"""Prefect layer (thin wrappers over rao_core)."""
