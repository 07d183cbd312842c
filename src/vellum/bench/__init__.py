"""bench layer (see docs/architecture.md)."""
