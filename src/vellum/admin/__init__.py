"""admin layer: use-cases shared by HTTP and CLI (see docs/architecture.md)."""
