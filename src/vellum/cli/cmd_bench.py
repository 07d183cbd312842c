"""``vellum bench``: throughput and latency of the write path against a running cluster."""

from __future__ import annotations

import os

import click

from vellum.cli.client_options import client_conf_flag, load_client_config_file
from vellum.cli.output import emit_json, emit_kv
from vellum.config import DEFAULT_METADATA_URI
from vellum.errors import VellumError


def register(cli: click.Group) -> None:
    cli.add_command(bench)


@click.command()
@click.option("--uri", default=lambda: os.environ.get("VELLUM_METADATA_URI", DEFAULT_METADATA_URI),
              show_default="$VELLUM_METADATA_URI or the standalone store", help="metadata service URI")
@click.option("-e", "--ensemble", default=1, show_default=True)
@click.option("-w", "--write-quorum", default=1, show_default=True)
@click.option("-a", "--ack-quorum", default=1, show_default=True)
@click.option("-s", "--entry-size", default=1024, show_default=True, help="bytes per entry")
@click.option("-l", "--ledgers", default=1, show_default=True, help="ledgers written round robin")
@click.option("-i", "--inflight", default=64, show_default=True, help="max adds outstanding")
@click.option("-r", "--rate", default=0.0, show_default=True, help="target entries/s (0 = max)")
@click.option("-t", "--duration", default=10.0, show_default=True, help="seconds")
@click.option("-n", "--max-entries", default=0, show_default=True, help="stop after N entries (0 = no limit)")
@client_conf_flag("for the bench's client (a secured cluster needs its TLS or token keys)")
@click.option("--json", "as_json", is_flag=True)
def bench(uri: str, ensemble: int, write_quorum: int, ack_quorum: int, entry_size: int, ledgers: int,
          inflight: int, rate: float, duration: float, max_entries: int, client_conf: str | None,
          as_json: bool) -> None:
    """Write entries and report throughput (entries/s, MB/s) and latency percentiles.

    The client takes its settings (TLS, authentication, timeouts, ...) from --client-conf or
    $VELLUM_CLIENT_CONF, the same file `vellum shell --client-conf` reads; -e/-w/-a set the
    ledgers' quorums."""
    import uvloop

    from vellum.bench.throughput_latency import BenchOptions, run_bench

    opts = BenchOptions(uri, ensemble, write_quorum, ack_quorum, entry_size, ledgers, inflight, rate, duration,
                        max_entries)

    def progress(elapsed: float, entries: int, rate_now: float) -> None:
        if not as_json:
            click.echo(f"  {elapsed:6.1f}s  {entries:>10,} entries  {rate_now:>10,.0f} entries/s", err=True)

    try:
        config = load_client_config_file(client_conf)
    except VellumError as e:
        raise click.ClickException(str(e)) from None
    try:
        result = uvloop.run(run_bench(opts, progress=progress, config=config))
    except VellumError as e:
        raise click.ClickException(f"vellum bench against {uri}: {e}") from None
    if as_json:
        emit_json({"options": {k: v for k, v in opts.__dict__.items() if k != "password"}, **result.to_dict()})
    if result.errors and not result.entries:
        raise click.ClickException(f"vellum bench against {uri}: every add failed ({result.errors}); the first: "
                                   f"{result.first_error}")
    if as_json:
        return
    emit_kv(
        {
            "entries": f"{result.entries:,}",
            "errors": f"{result.errors}" + (f" (first: {result.first_error})" if result.errors else ""),
            "elapsed": f"{result.elapsed_s:.2f} s",
            "throughput": f"{result.entries_per_s:,.0f} entries/s, {result.mb_per_s:,.2f} MB/s",
            **{f"latency {k}": f"{v:.3f} ms" for k, v in result.latency_ms.items()},
        },
        title=f"vellum bench: E={ensemble} W={write_quorum} A={ack_quorum}, {entry_size} B, {inflight} in flight",
    )
