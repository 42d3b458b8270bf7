"""Shared by the benchmark scripts: the machine description every results file starts with."""

from __future__ import annotations

import datetime as dt
import os
import platform


def machine_info() -> str:
    """Cores, RAM, GPU (or none), Python and torch versions, and today's date, on one line."""
    try:
        ram_s = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        ram_s = "unknown"
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        torch_s = f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        gpu, torch_s = "unknown (no torch)", ""
    return (
        f"{platform.platform()}, {os.cpu_count()} cores, RAM {ram_s}, GPU {gpu}, "
        f"python {platform.python_version()}{torch_s}; date {dt.date.today().isoformat()}"
    )
