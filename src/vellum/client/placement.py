"""Choosing bookies: ensemble placement policies (BookKeeper's EnsemblePlacementPolicy).

Responsibility: pick the bookies of a new ensemble and the replacement of a failed ensemble
member, from the writable bookies the metadata store lists, and tell whether an existing
ensemble meets the policy (the auditor's placement check). Pure except for the network
locations, which come from a :mod:`vellum.client.topology` resolver (a script BookKeeper-style,
or a mapping) and :func:`load_rack_mapping` reading the file it is given.

Invariants of every policy:
* an ensemble has distinct members; a replacement is never a current member of the ensemble;
* read-only bookies are never chosen (a bookie listed both writable and read-only counts as
  read-only), nor excluded ones (e.g. bookies quarantined after errors);
* when there are not enough candidates the policy raises :class:`NotEnoughBookiesError` saying
  how many were needed and how many were available.

Write quorums: entry ``e`` is written to ``ensemble[(e + i) % E] for i < WQ`` (round-robin
striping), so every window of ``WQ`` consecutive ensemble positions, wrapping around, is a write
quorum (one window when ``E == WQ``). The topology-aware policies rate each window with a
*level* (racks, zones or regions it spans, 0 when it breaks a hard rule) and search for an
arrangement of network locations in which every window reaches a target level; when none exists
they degrade one level at a time down to their floor, below which they raise:

* **rack-aware** (``RackawarePlacementPolicy``): level = racks in the window; target
  ``min(minNumRacksPerWriteQuorum, WQ, racks available)``; floor = the target with
  ``enforceMinNumRacksPerWriteQuorum``, else 1. Unknown bookies are on ``/default-rack``.
* **zone-aware** (``ZoneawarePlacementPolicy``): locations ``/zone/upgradedomain``; level = zones
  in the window, or 0 when two bookies of one zone in the window share an upgrade domain;
  target ``min(desiredNumZonesPerWriteQuorum, WQ, zones available)``; with
  ``enforceStrictZoneawarePlacement`` the floor is ``minNumZonesPerWriteQuorum``, bookies whose
  location is unknown are never chosen, and ``E`` must be a multiple of ``WQ`` with
  ``WQ > minNumZonesPerWriteQuorum`` (BookKeeper's rules); without it, best effort (floor 0).
* **region-aware** (``RegionawarePlacementPolicy``): locations ``/region/rack``; level = regions
  in the window. With ``reppRegionsToWrite`` set, durability is enforced: no
  ``reppMinimumRegionsForDurability - 1`` regions may hold ``AQ`` members of a write quorum
  (so every acknowledged entry is in that many regions), level 0 otherwise, floor 1. A
  replacement comes from the replaced bookie's rack, else its region (which keeps every
  region's share), else any region that keeps durability
  (``reppEnableDurabilityEnforcementInReplace``). Racks inside a region are only preferred apart
  (the search order), ``minNumRacksPerWriteQuorum`` is not applied per region.

A replacement is the candidate whose location gives the worst write quorum containing the
replaced position the best level, the same rating as new ensembles (ties: the location with
most candidates, then random).

Modules: this one builds a policy from the configuration (``placement_policy_for``, the topology
resolver, rack mapping files) and is where every placement name is imported from; what the
policies share is ``client/placement_core.py``; one module per topology-aware kind
(``placement_rack.py``, ``placement_zone.py``, ``placement_region.py``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from pathlib import Path

from vellum.client.placement_core import (
    DEFAULT_RACK,
    DefaultPlacementPolicy,
    PlacementPolicy,
    TopologyAwarePlacementPolicy,
    min_racks_per_write_quorum,
    write_quorum_windows,
)
from vellum.client.placement_rack import RackawarePlacementPolicy
from vellum.client.placement_region import RegionawarePlacementPolicy, parse_region_location
from vellum.client.placement_zone import ZoneawarePlacementPolicy, parse_zone_location
from vellum.client.topology import MappingResolver, ScriptError, ScriptResolver, TopologyResolver
from vellum.config import ClientConfig, placement_policy_name
from vellum.errors import ConfigError

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------
# Rack mapping and construction from configuration


def parse_rack_mapping(text: str, *, source: str = "rack mapping") -> dict[str, str]:
    """Parse ``bookie_id /location`` lines (``#`` comments, blank lines ignored)."""
    mapping: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].startswith("/"):
            raise ConfigError(f"{source}:{lineno}: expected 'bookie_id /rack', got {raw.strip()!r}")
        mapping[fields[0]] = fields[1]
    return mapping


def load_rack_mapping(path: str | Path) -> dict[str, str]:
    """Read a rack mapping file: one ``bookie_id /location`` per line, ``#`` comments."""
    p = Path(path)
    return parse_rack_mapping(p.read_text(encoding="utf-8"), source=str(p))


#: ``reppDnsResolverClass`` values Vellum honours: BookKeeper's script-based mapping
SCRIPT_BASED_MAPPING = "org.apache.bookkeeper.net.ScriptBasedMapping"


def topology_resolver_for(config: ClientConfig, *, mapping: Mapping[str, str] | None = None) -> TopologyResolver | None:
    """The resolver of the topology-aware policies: the script ``networkTopologyScriptFileName``
    when set (checked by one run with no argument, as BookKeeper does), else ``mapping`` (e.g.
    the one ``vellum shell racks`` keeps in the metadata store); ``None`` when there is neither
    (every bookie in the default location). A failed check raises :class:`ConfigError`."""
    resolver_class = config.repp_dns_resolver_class.strip()
    if resolver_class and resolver_class.rsplit(".", 1)[-1] != SCRIPT_BASED_MAPPING.rsplit(".", 1)[-1]:
        raise ConfigError(
            f"reppDnsResolverClass={resolver_class} is refused with ensemblePlacementPolicy="
            f"{config.ensemble_placement_policy}: Vellum learns network locations from the script "
            f"networkTopologyScriptFileName ({SCRIPT_BASED_MAPPING}) or from the mapping `vellum shell racks` "
            "keeps in the metadata store; remove the key or set it to ScriptBasedMapping"
        )
    script = config.network_topology_script_file_name
    if script:
        resolver = ScriptResolver(script, number_args=config.network_topology_script_number_args,
                                  timeout_s=config.network_topology_script_timeout_ms / 1000.0)
        try:
            resolver.check()
        except ScriptError as e:
            raise ConfigError(
                f"networkTopologyScriptFileName={script}: the topology script failed its check run (no "
                f"argument): {e}. It must be executable, take bookie host addresses as arguments and print "
                "one network location per argument (/rack, /region/rack or /zone/upgradedomain)"
            ) from None
        return resolver
    if mapping is not None:
        return MappingResolver(mapping)
    return None


def placement_policy_for(
    config: ClientConfig, *, rack_mapping: Mapping[str, str] | None = None, rng: random.Random | None = None
) -> PlacementPolicy:
    """The policy ``ensemblePlacementPolicy`` names (Vellum's short names or BookKeeper's class
    names), its locations from :func:`topology_resolver_for`. May run the topology script once:
    call it off the event loop."""
    name = placement_policy_name(config.ensemble_placement_policy)
    if name == "default":
        return DefaultPlacementPolicy(rng)
    try:
        resolver = topology_resolver_for(config, mapping=rack_mapping)
    except ConfigError as e:
        if name == "rackaware" and not config.enforce_min_num_racks_per_write_quorum:
            # BookKeeper's rack-aware policy falls back to the default rack unless enforced
            log.warning("%s; every bookie is on %s (set enforceMinNumRacksPerWriteQuorum=true to fail instead)",
                        e, DEFAULT_RACK)
            resolver = None
        else:
            raise
    resolver = resolver or MappingResolver({})
    if name == "rackaware":
        return RackawarePlacementPolicy(
            resolver,
            min_racks_per_write_quorum=config.min_num_racks_per_write_quorum,
            enforce=config.enforce_min_num_racks_per_write_quorum,
            rng=rng,
        )
    if name == "zoneaware":
        return ZoneawarePlacementPolicy(
            resolver,
            min_zones=config.min_num_zones_per_write_quorum,
            desired_zones=config.desired_num_zones_per_write_quorum,
            strict=config.enforce_strict_zoneaware_placement,
            rng=rng,
        )
    regions = [r.strip() for r in config.repp_regions_to_write.split(";") if r.strip()]
    return RegionawarePlacementPolicy(
        resolver,
        regions_to_write=regions,
        min_regions_for_durability=config.repp_minimum_regions_for_durability,
        durability_in_replace=config.repp_enable_durability_enforcement_in_replace,
        rng=rng,
    )


__all__ = [
    "DEFAULT_RACK", "DefaultPlacementPolicy", "PlacementPolicy", "RackawarePlacementPolicy",
    "RegionawarePlacementPolicy", "TopologyAwarePlacementPolicy", "ZoneawarePlacementPolicy", "load_rack_mapping",
    "min_racks_per_write_quorum", "parse_rack_mapping", "parse_region_location", "parse_zone_location",
    "placement_policy_for", "topology_resolver_for", "write_quorum_windows",
]
