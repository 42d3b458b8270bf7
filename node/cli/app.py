"""``swarm-node``: parse arguments, then import the heavy modules inside each command (``--help`` is instant)."""

from __future__ import annotations

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


@app.command()
def join(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Where metrics, rollouts, checkpoints and the key go.")],
    peers: Annotated[
        list[str] | None, typer.Option("--peers", help="Multiaddr of a peer to bootstrap from (repeatable).")
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option(
            "--max-steps",
            min=1,
            help="Stop when the run has this many steps in total (resumed steps count; re-running the same "
            "command after a crash finishes the job).",
        ),
    ] = None,
    linger: Annotated[
        float,
        typer.Option(
            "--linger",
            min=0,
            help="After --max-steps, stay in the swarm this many seconds (Ctrl-C leaves sooner), so peers still "
            "joining through this node or fetching its records find it.",
        ),
    ] = 0.0,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="Node config YAML, or a profile: lab (the default: the laboratory node, which learns on CPU), "
            "tiny (a fast test node).",
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config field: section.field=value (repeatable).")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any).")] = None,
    identity: Annotated[
        Path | None, typer.Option("--identity", help="Ed25519 key file (default RUN_DIR/identity.key, created).")
    ] = None,
    transport: Annotated[
        str | None, typer.Option("--transport", help="hivemind (default), libp2p, or memory (alone, no network).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue from RUN_DIR's latest checkpoint, if any.")] = True,
    log_level: Annotated[
        str, typer.Option("--log-level", help="Level of the node's own log lines on stderr (DEBUG: all libraries).")
    ] = "INFO",
) -> None:
    """Join a swarm (or start one: no --peers) and train; print the addresses other nodes can join."""
    from node.cli.logs import setup_cli_logging
    from protocol.errors import SwarmError

    try:
        setup_cli_logging(log_level)
    except ValueError as e:
        fail(str(e))
    sets = list(overrides or [])
    if transport is not None:
        sets.append(f"transport.type={transport}")
    try:
        from node.cli.join import run_join
        from node.config import config_file

        code = run_join(
            run_dir=run_dir,
            config_path=config_file(config),
            overrides=sets,
            peers=list(peers or []),
            host=host,
            port=port,
            identity_path=identity,
            max_steps=max_steps,
            resume=resume,
            linger_s=linger,
        )
    except SwarmError as e:
        fail(str(e))
    from node.cli.join import exit_process

    exit_process(code)


@app.command("eval")
def eval_(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="The run directory of a `swarm-node join`.")],
    step: Annotated[
        int | None, typer.Option("--step", min=0, help="Evaluate this step's checkpoint (default: the latest).")
    ] = None,
    initial: Annotated[
        bool, typer.Option("--initial", help="Evaluate the run's initial model (before any training).")
    ] = False,
    items: Annotated[
        int | None, typer.Option("--items", min=1, help="Held-out items per family (default: the run's eval config).")
    ] = None,
    side: Annotated[
        str | None,
        typer.Option(
            "--side", help="Side of the split to read: test (reported results) or dev (probes); default: the run's."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
) -> None:
    """Evaluate a run's checkpoint (or its initial model) on held-out questions it never trained on (the test or
    dev side of the split; the result names it)."""
    import json

    from node.cli.logs import setup_cli_logging
    from protocol.errors import SwarmError

    setup_cli_logging("INFO")  # a first use builds or converts the model: its progress lines show on stderr
    if step is not None and initial:
        fail("--step and --initial exclude each other")
    if side not in (None, "dev", "test"):
        fail(f"--side must be dev or test, not {side!r}")
    try:
        from node.eval import evaluate_run

        result = evaluate_run(
            run_dir, step=step, initial=initial, items=items, side="dev" if side == "dev" else "test" if side else None
        )
    except SwarmError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
        return
    from node.eval import eval_table

    typer.echo(eval_table(result))


@app.command()
def watch(
    peers: Annotated[
        list[str] | None, typer.Option("--peers", help="Multiaddr of a swarm peer to read from (repeatable).")
    ] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port of the web page (0: any).")] = 8080,
    host: Annotated[
        str, typer.Option("--host", help="Address the web page listens on (default: this machine only).")
    ] = "127.0.0.1",
    config: Annotated[
        str | None,
        typer.Option("--config", help="Node config YAML or profile (default lab): its swarm_id, protocol, transport."),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config field: section.field=value (repeatable).")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="Python logging level.")] = "WARNING",
) -> None:
    """Observe a swarm read-only (no model, no torch): verify every record, serve a live page and /api/state."""
    from node.cli.logs import setup_cli_logging
    from protocol.errors import SwarmError

    setup_cli_logging(log_level)
    try:
        from node.config import config_file
        from node.observer.watch import run_watch

        code = run_watch(
            config_path=config_file(config),
            overrides=list(overrides or []),
            peers=list(peers or []),
            host=host,
            port=port,
        )
    except SwarmError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot serve the page on {host}:{port}: {e.strerror or e}")
    raise typer.Exit(code=code)


@app.command()
def export(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Run directory of a node (config.yaml + checkpoints/).")],
    out: Annotated[Path, typer.Option("--out", help="New directory for the Hugging Face model.")],
    step: Annotated[int | None, typer.Option("--step", min=0, help="Checkpoint step (default: the latest).")] = None,
) -> None:
    """Write a checkpoint as a Hugging Face model directory (safetensors, tokenizer, model card)."""
    from node.cli.logs import setup_cli_logging
    from protocol.errors import SwarmError

    setup_cli_logging("INFO")
    try:
        from node.cli.export import export_run

        path = export_run(run_dir, out, step)
    except SwarmError as e:
        fail(str(e))
    typer.echo(f"exported to {path}; upload with: huggingface-cli upload USER/NAME {path} .")


@app.command()
def doctor(
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port join will listen on (0: any).")] = 0,
    host: Annotated[str, typer.Option("--host", help="Address join will listen on.")] = "127.0.0.1",
    peers: Annotated[
        list[str] | None, typer.Option("--peers", help="Multiaddr of a peer to check (repeatable).")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option("--config", help="The node config or profile join will use (its rollout engine is checked)."),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config field, as for join (repeatable).")
    ] = None,
) -> None:
    """Check that this machine can join a swarm: rollout engine, port, p2pd daemon, addresses (NAT), peers; one
    remedy a line."""
    from node.cli.doctor import doctor as run_doctor
    from node.cli.logs import setup_cli_logging
    from node.config import NodeConfig, config_file
    from protocol.config import load_config
    from protocol.errors import SwarmError

    setup_cli_logging("WARNING")
    try:
        cfg = load_config(NodeConfig, config_file(config), list(overrides or []))
    except SwarmError as e:
        fail(str(e))
    engine = (cfg.rollout.engine, cfg.vllm.mode, cfg.vllm.url)
    raise typer.Exit(code=run_doctor(host, port, list(peers or []), typer.echo, engine=engine))


def main() -> None:
    app(prog_name="swarm-node")


if __name__ == "__main__":
    main()
