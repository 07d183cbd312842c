"""Composition root: builds a running bookie (storage, bookie, server, HTTP, metadata) from a
ServerConfig. Nothing below this module knows how the parts are wired together."""
