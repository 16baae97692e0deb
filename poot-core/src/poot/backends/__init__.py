"""Backends that ship inside poot-core (only the reference backend)."""
