"""Server and client configuration: frozen dataclasses with BookKeeper's keys and defaults.

Each field is a BookKeeper configuration key in snake_case with a unit suffix; its camelCase
BookKeeper name is accepted in ``bk_server.conf``-style files (``key=value`` lines, ``#``
comments, lists comma-separated). Every other key BookKeeper 4.16-4.18 defines is handled by
``config_keys`` (honoured through an alias, accepted as not used, or refused for values Vellum
cannot honour); a key no BookKeeper release defines is an error with a "did you mean" suggestion.
Values are validated against ranges and cross-field rules when the object is built; errors in a
file name the file, the line and the key.
Where Vellum's default differs from BookKeeper's code default, the field's doc says why.
No I/O except ``load_server_config``/``parse_conf_file`` reading the file they are given.

The package, by role: ``declare`` (how a key is declared, checked, converted and listed),
``shared`` (the key groups a bookie and a client both read, declared once), ``server``
(``ServerConfig``), ``client`` (``ClientConfig``), ``files`` (files, key maps and the keys of
the other side). Import from ``vellum.config``.
"""

from vellum.config.client import ClientConfig
from vellum.config.declare import describe
from vellum.config.files import (
    build_config,
    load_client_config,
    load_server_config,
    parse_conf_file,
    parse_conf_lines,
)
from vellum.config.server import ServerConfig, compaction_enabled, validate_compaction_order
from vellum.config.shared import (
    DEFAULT_DATA_DIR,
    DEFAULT_METADATA_URI,
    PLACEMENT_FIELDS,
    PLACEMENT_POLICIES,
    TLS_CONTEXT_FACTORY,
    placement_policy_name,
)

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_METADATA_URI",
    "PLACEMENT_FIELDS",
    "PLACEMENT_POLICIES",
    "TLS_CONTEXT_FACTORY",
    "ClientConfig",
    "ServerConfig",
    "build_config",
    "compaction_enabled",
    "describe",
    "load_client_config",
    "load_server_config",
    "parse_conf_file",
    "parse_conf_lines",
    "placement_policy_name",
    "validate_compaction_order",
]
