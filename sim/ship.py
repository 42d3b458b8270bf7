"""``python -m sim.ship [CONFIG...]``: build the laboratory recipes a config's nodes use and ship them in the
package (``node.model.shipped``: ``node/model/weights/lab-<recipe key>/`` with the recipe and a SHA-256 manifest).

By default the recipes of the README's main job (``configs/sim/demo.yaml``) and of the default node (the ``lab``
profile). Every recipe is built from scratch, never copied from the cache.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_CONFIGS = ("configs/sim/demo.yaml", "lab")


def ship(recipe: Any, root: Path | None = None) -> Path:
    """Build ``recipe`` (a ``LabRecipe``) from scratch, never from the cache, into ``root``/lab-<key>, replacing
    what was shipped for it."""
    from node.model import lab, shipped

    root = root or shipped.WEIGHTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"lab-{recipe.key()}"
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        built = Path(tmp) / "model"
        lab.build(recipe, built)
        shipped.write_manifest(built)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(built), target)
    return target


def config_recipes(path: str | Path) -> list[Any]:
    """The laboratory recipes the nodes of a config build, deduplicated, in order: every node of every
    configuration and seed of a simulator config (``swarm-sim``), or the one node of a node config (a file or a
    profile's name)."""
    import yaml

    from node.config import NodeConfig, config_file
    from node.model import lab
    from protocol.config import load_config
    from sim.config import load_sim_config

    path = config_file(path)
    data = yaml.safe_load(Path(path).read_text()) or {}
    if isinstance(data, dict) and ("configurations" in data or "nodes" in data):
        sim = load_sim_config(str(path))
        models = [sim.node_config(v.name, i, s).model for v in sim.configurations for s in sim.seeds
                  for i in range(sim.nodes)]  # fmt: skip
    else:
        models = [load_config(NodeConfig, path).model]
    out: dict[str, Any] = {}
    for model in models:
        if model.name == lab.LAB_NAME:
            recipe = lab.recipe_with(model.builtin)
            out.setdefault(recipe.key(), recipe)
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.ship", description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=list(DEFAULT_CONFIGS), help="configs whose recipes to ship")
    parser.add_argument("--out", type=Path, default=None, help="weights directory (default: the package's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    recipes = {r.key(): r for c in args.configs for r in config_recipes(c)}
    if not recipes:
        print(f"error: no builtin:lab model in {args.configs}", file=sys.stderr)
        return 2
    for recipe in recipes.values():
        print(f"shipped {ship(recipe, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
