"""``swarm-sim``: run simulator experiments from YAML; heavy imports happen inside commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run swarm simulations and experiments.")


@app.callback()
def _root() -> None:
    """Run swarm simulations and experiments."""


def fail(message: str) -> None:
    """One clear line on stderr, exit code 1 (never a traceback for user errors)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=1)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="Experiment YAML (configs/sim/*.yaml).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory: per-node metrics, results table, plots.")],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a field, e.g. --set steps=5 (repeatable).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Apply the config's quick: overrides (a short run).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every library at DEBUG level.")] = False,
) -> None:
    """Run every configuration of CONFIG for every seed, then write results.csv, results.md and rewards.png."""
    from node.cli.logs import setup_cli_logging

    setup_cli_logging("DEBUG" if verbose else "INFO")
    from node.cli.preflight import check_trackers, make_output_dir
    from protocol.errors import SwarmError
    from sim.config import load_sim_config

    try:
        cfg = load_sim_config(str(config), overrides or [], quick=quick)
        check_trackers(cfg.trackers())
        if cfg.policy == "real":  # every node's task families, before any model is built
            from node.tasks.registry import check_families

            overridden = set(cfg.heterogeneity.node_overrides).union(*(v.node_overrides for v in cfg.configurations))
            check_families(
                f
                for v in cfg.configurations
                for i in sorted({0} | {i for i in overridden if i < cfg.nodes})  # the other nodes are node 0's twins
                for f in cfg.node_config(v.name, i, cfg.seeds[0]).tasks.families
            )
        make_output_dir(out, "--out directory")
    except SwarmError as e:
        fail(str(e))
    from protocol.config import write_resolved
    from sim.report.summary import collect, glance_table, markdown_table, write_report
    from sim.runner import run_experiment

    try:
        write_resolved(cfg, out)
        run_experiment(cfg, out, progress=lambda line: typer.echo(line, err=True))
    except SwarmError as e:
        fail(str(e))
    order = [v.name for v in cfg.configurations]
    results = collect(out, order)
    rows = write_report(out, title=cfg.name, order=order, results=results)
    typer.echo(markdown_table(rows), nl=False)
    glance = glance_table(results)
    if glance:  # the nodes half-know their families: what each learned of the one it lacks, and kept of its own
        typer.echo(
            "\nHeld-out exact, first -> last evaluation, ± one standard error of the change:\n\n" + glance, nl=False
        )
    plots = ", ".join(f"{out}/{p.name}" for p in sorted(Path(out).glob("*.png")))
    typer.echo(f"results in {out}/results.md and {out}/report.html, plots in {plots}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def experiment(ctx: typer.Context) -> None:
    """Run a registered learning experiment (a configs/sim YAML with a registration: block) pair by pair, then
    write its report (--help for the options)."""
    from sim.driver.main import main as run_registered

    raise typer.Exit(code=run_registered(list(ctx.args)))


def main() -> None:
    app(prog_name="swarm-sim")


if __name__ == "__main__":
    main()
