"""AutoRecovery's settings: BookKeeper's keys as plain values (built from ``ServerConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from vellum.config import ServerConfig


@dataclass(frozen=True)
class AutoRecoverySettings:
    lost_bookie_recovery_delay_s: int = 0
    bookie_check_interval_s: int = 86400
    ledger_check_interval_s: int = 604800
    ledger_verification_percentage: int = 0
    replicas_check_interval_s: int = 0
    placement_policy_check_interval_s: int = 0
    open_ledger_grace_period_ms: int = 30000
    entry_batch_size: int = 10
    rate_by_bytes: int = -1
    #: queuing delay a worker tolerates before it yields to foreground traffic (None: never yields)
    yield_target_s: float | None = 0.010
    backoff_ms: int = 5000
    request_timeout_s: float = 10.0
    #: how often the auditor looks at the registrations for lost bookies
    tick_s: float = 1.0
    #: how often the auditor logs one summary of the ledgers that cannot heal (while there are any)
    cannot_heal_summary_s: float = 300.0

    @classmethod
    def from_config(cls, config: ServerConfig) -> AutoRecoverySettings:
        return cls(
            lost_bookie_recovery_delay_s=config.lost_bookie_recovery_delay_s,
            bookie_check_interval_s=config.auditor_periodic_bookie_check_interval_s,
            ledger_check_interval_s=config.auditor_periodic_check_interval_s,
            ledger_verification_percentage=config.auditor_ledger_verification_percentage,
            replicas_check_interval_s=config.auditor_replicas_check_interval_s,
            placement_policy_check_interval_s=config.auditor_periodic_placement_policy_check_interval_s,
            open_ledger_grace_period_ms=config.open_ledger_rereplication_grace_period_ms,
            entry_batch_size=config.rereplication_entry_batch_size,
            rate_by_bytes=config.replication_rate_by_bytes,
            yield_target_s=(config.replication_yield_delay_ms / 1000
                            if config.replication_yield_to_foreground else None),
            backoff_ms=config.rw_rereplicate_backoff_ms,
        )
