"""console layer: the operator console, a web view of the whole cluster (docs/console.md).

Server-rendered pages (aiohttp + Jinja2 templates) over the metadata store, the bookies' admin
HTTP API (found through their registrations) and Vellum's client; a vendored chart library
(uPlot) served by the console itself. Read-only unless an admin token is configured; mutating
actions go to the bookies' admin HTTP API with that token, like the shell's, and only to https
bookies whose certificate the console verified. Its users log in (``access``: sessions with
their own anti-forgery tokens; ``Host`` and ``Origin`` checked on every request).
"""
