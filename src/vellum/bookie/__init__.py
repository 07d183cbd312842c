"""bookie layer (see docs/architecture.md)."""
