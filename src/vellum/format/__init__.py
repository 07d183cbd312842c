"""format layer (see docs/architecture.md)."""
