"""`stepscope serve ROOT [--host 127.0.0.1] [--port 8765]`: the live local dashboard."""

from __future__ import annotations

import click

from . import cli

__all__ = ["serve_cmd"]


@cli.command("serve")
@click.argument("root", type=click.Path(file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Requests must carry the token printed in the "
                   "URL, and name localhost or this address in their Host header.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0 = any free port).")
def serve_cmd(root: str, host: str, port: int) -> None:
    """Serve the dashboard of every run under ROOT until Ctrl-C.

    Runs table (search, --where filters, sort, status, both ledgers' key numbers; pick two
    to compare), and per run: the three-layer sheet, interactive charts by step, tokens or
    wall time (loss, lr, grad norm, loss scale, step time with warm-up shaded, tokens/s,
    MFU, memory in GiB, data wait, comm), the stacked phase split per step, a rank x step
    heatmap with the slowest ranks, findings and alerts, the latest profile, and the run's
    environment and command. Pages refresh while a run is still writing.
    """
    from ..report.serve import is_loopback, make_server

    server = make_server(root, host, port)
    if not is_loopback(host):
        click.echo(f"stepscope: serving on {host}, reachable from the network: requests "
                   "need the token in the URL below", err=True)
    click.echo(f"stepscope: dashboard of {root} at {server.url} (Ctrl-C to stop)")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
