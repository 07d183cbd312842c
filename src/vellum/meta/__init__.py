"""meta layer (see docs/architecture.md)."""
