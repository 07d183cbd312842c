"""admin layer (see docs/architecture.md)."""
