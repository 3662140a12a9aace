"""``python -m e2e.bench_batch``: ``sageserve bench batch`` on SQLite and on a throwaway
PostgreSQL.

Why here and not in the package: starting a database server is the test harness's job,
and the installed package never imports ``e2e/``. This entry starts PostgreSQL (Debian's
package, ``e2e/postgres.py``) with its default durability (every commit reaches the disk,
as SQLite's ``synchronous=FULL``), runs the bench of ``sageserve.commands.bench_batch`` on
both databases, and removes the server.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from e2e import postgres
from sageserve.commands.bench_batch import bench_batch_command, bench_release_command

app = typer.Typer(add_completion=False)
console = Console()
err_console = Console(stderr=True)


@app.command()
def main(
    requests: Annotated[int, typer.Option(help="Requests per batch.")] = 10_000,
    workers: Annotated[str, typer.Option(help="Release worker threads per run.")] = "1,4",
    claim_size: Annotated[int, typer.Option(help="Requests per claim.")] = 2,
    release_compare: Annotated[
        bool,
        typer.Option(help="Only the release path: complete against complete_many."),
    ] = False,
    flush_size: Annotated[
        int, typer.Option(help="--release-compare: answers per complete_many.")
    ] = 64,
    repeats: Annotated[int, typer.Option(help="--release-compare: repetitions.")] = 5,
) -> None:
    """Start PostgreSQL on loopback, run `sageserve bench batch` on SQLite and on it."""
    counts = [int(w) for w in workers.split(",") if w.strip()]
    try:
        server = postgres.start(durable=True)
    except postgres.PostgresError as err:
        err_console.print(str(err), markup=False, highlight=False)
        raise typer.Exit(2) from None
    try:
        url = server.create_database("bench_batch")
        if release_compare:
            bench_release_command(requests, claim_size, flush_size, repeats, url, console)
        else:
            bench_batch_command(requests, counts, claim_size, url, console)
    finally:
        server.stop()


if __name__ == "__main__":
    app()
