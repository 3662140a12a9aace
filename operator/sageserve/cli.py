"""The `sageserve` command line.

Commands import their heavy modules inside the function body so that `sageserve --help`
stays instant and a missing optional dependency only affects the command that needs it.
"""

from __future__ import annotations

import typer
from rich.console import Console

from sageserve import __version__

app = typer.Typer(
    name="sageserve",
    help="Forecast-aware autoscaling of LLM inference fleets on Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@app.command()
def version() -> None:
    """Print the sageserve version."""
    console.print(f"sageserve {__version__}")


if __name__ == "__main__":
    app()
