"""Laboratory models shipped in the package, so the README's main job starts training without a build.

Building a laboratory model is a supervised warm start of a few minutes per recipe (``node.model.lab``); the demo
needs two. The weights of the recipes the main job uses are built once by this module's command and shipped under
``node/model/weights/lab-<recipe key>/``, beside the recipe they came from and a manifest of their files' SHA-256.
``node.model.lab.ensure_built`` installs a shipped directory into the cache instead of building it when its recipe
key matches; a directory whose recipe or files do not match is refused with one warning and the recipe is built.

Kept honest three ways: the directory's name is the recipe's digest (the recipe file must hash to it, with the build
code version, so a change of the build code orphans it rather than passing it off); the manifest is checked on every
install; and a ``slow`` test (``tests/unit/node/test_shipped_weights.py``) rebuilds a shipped recipe and checks that
the rebuilt and the shipped model agree on held-out exact accuracy.

Rebuild (after changing the build code or a shipped recipe), with ``sim.ship``::

    python -m sim.ship                         # the recipes of configs/sim/demo.yaml and the default node
    python -m sim.ship configs/sim/other.yaml  # or of any simulator or node config
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

#: Where shipped laboratory models live (package data).
WEIGHTS_DIR = Path(__file__).with_name("weights")
MANIFEST = "MANIFEST.json"
RECIPE_FILE = "rl_swarm_recipe.json"


class ShippedMismatch(Exception):
    """A shipped directory that does not hold what its name promises."""


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def shipped_dir(key: str, root: Path | None = None) -> Path | None:
    """The shipped directory of the recipe with digest ``key``, or None."""
    d = (root or WEIGHTS_DIR) / f"lab-{key}"
    return d if (d / MANIFEST).is_file() else None


def verify(src: Path, recipe: dict[str, Any], key: str) -> dict[str, str]:
    """The manifest of ``src`` once its recipe equals ``recipe``, hashes to ``key`` and every file matches its
    digest; ``ShippedMismatch`` names the first thing that does not."""
    from node.model.tiny import recipe_key

    try:
        manifest = json.loads((src / MANIFEST).read_text())
        stored = json.loads((src / RECIPE_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ShippedMismatch(f"unreadable manifest or recipe: {e}") from e
    if stored != recipe or recipe_key(stored) != key:
        raise ShippedMismatch("its recipe is not the one asked for (rebuild: python -m sim.ship)")
    if not isinstance(manifest, dict) or RECIPE_FILE not in manifest:
        raise ShippedMismatch("its manifest does not list the recipe file")
    for name, digest in manifest.items():
        f = src / name
        if Path(name).name != name or not f.is_file():
            raise ShippedMismatch(f"{name!r} is listed but missing")
        if _sha256(f) != digest:
            raise ShippedMismatch(f"{name!r} does not match its SHA-256 in the manifest")
    return manifest


def install(src: Path, out: Path, recipe: dict[str, Any], key: str) -> None:
    """Copy a verified shipped directory into ``out`` (a build directory: the recipe file is written last)."""
    manifest = verify(src, recipe, key)
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(manifest, key=lambda n: n == RECIPE_FILE):
        shutil.copyfile(src / name, out / name)


def write_manifest(d: Path) -> dict[str, str]:
    manifest = {f.name: _sha256(f) for f in sorted(d.iterdir()) if f.is_file() and f.name != MANIFEST}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest
