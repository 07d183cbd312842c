"""client layer (see docs/architecture.md)."""
