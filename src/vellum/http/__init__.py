"""http layer (see docs/architecture.md)."""
