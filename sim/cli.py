"""``swarm-sim``: run simulator experiments from YAML; heavy imports happen inside commands."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run swarm simulations and experiments.")


@app.callback()
def _root() -> None:
    """Run swarm simulations and experiments."""


def main() -> None:
    app(prog_name="swarm-sim")
