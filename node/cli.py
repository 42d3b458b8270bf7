"""``swarm-node``: parse arguments, then import the heavy modules inside each command (``--help`` is instant)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run a node of the RL swarm.")


def fail(message: str) -> None:
    """Print one clear line to stderr and exit 1 (never a traceback for user errors)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@app.command()
def keygen(
    out: Annotated[Path, typer.Option("--out", help="Where to write the Ed25519 key file (mode 0600).")],
    force: Annotated[bool, typer.Option(help="Overwrite an existing key file.")] = False,
) -> None:
    """Create a node identity (Ed25519 key pair) and print its peer id."""
    from protocol.errors import SwarmError
    from protocol.identity import Identity

    try:
        if out.exists() and not force:
            fail(f"{out} exists; pass --force to overwrite it")
        ident = Identity.generate()
        ident.save(out)
    except SwarmError as e:
        fail(str(e))
    typer.echo(ident.peer_id)


def main() -> None:
    app(prog_name="swarm-node")


if __name__ == "__main__":
    sys.exit(main())
