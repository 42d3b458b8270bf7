"""The machine description every results file starts with (the experiment driver's reports and the benchmarks').

Imports nothing heavy at import time (torch only inside :func:`machine_info`, and only if installed), so the
libp2p benchmark, which must never share a process with hivemind, can use it too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


def _ram() -> str:
    try:
        return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB"
    except (ValueError, OSError, AttributeError):
        return "unknown"


def _nvidia_smi_gpu() -> str:
    """The first GPU's name from ``nvidia-smi`` (for processes without torch); "none" without one."""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
            return subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip() or "none"
    return "none"


def cpu_model() -> str:
    """The processor's model name, family and model numbers, the vector instructions torch uses on it and, where
    other, those a laboratory build is pinned to (``node.model.lab.BUILD_CPU_CAPABILITY``), e.g. "AMD EPYC (family 25
    model 17), AVX512 (laboratory builds on AVX2)": what decides
    a model built here to the last bit (another processor rounds another way, so a warm start built from the same
    recipe on it differs)."""
    name = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)  # fmt: skip
        info = {k.strip(): v.strip() for k, v in info.items()}
        name = info.get("model name", name)
        # one model name covers several generations (a virtual machine says "AMD EPYC" for each): the family and
        # model numbers tell them apart
        if "cpu family" in info and "model" in info:
            name += f" (family {info['cpu family']} model {info['model']})"
    with contextlib.suppress(ImportError, AttributeError):
        import torch

        from node.model.lab import build_capability

        own, build = torch.backends.cpu.get_cpu_capability(), build_capability()
        name += f", {own}" + (f" (laboratory builds on {build})" if build != own else "")  # a build on other kernels
    return name


def machine_info(packages: Sequence[str] = (), *, with_torch: bool = True) -> str:
    """Cores, RAM, GPU (or none), Python and torch versions, the versions of ``packages`` (e.g. ``hivemind``),
    and the date and time (UTC), on one line.

    ``with_torch=False`` leaves torch out (and unimported: benchmarks whose processes never load it); the GPU
    then comes from ``nvidia-smi``, as it does when torch is not installed."""
    gpu, torch_s = None, ""
    if with_torch:
        try:
            import torch

            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
            torch_s = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
        except ImportError:
            pass
    if gpu is None:
        gpu = _nvidia_smi_gpu()
    pkgs = "".join(f", {name} {md.version(name)}" for name in packages)
    return (
        f"{platform.platform()}, {os.cpu_count()} cores, RAM {_ram()}, GPU {gpu}, "
        f"python {platform.python_version()}{torch_s}{pkgs}; date {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )
