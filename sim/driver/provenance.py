"""Where a registration and its results come from: the registration hash every result carries, the refusal of
results made under another registration, and the commits the report names ("registered at commit X on date D;
first result at commit Y"), read from git.

Registered-at rule: a registration that says where it was first written (``registered:``, for ones that were a
docstring before they were data) is taken at its word, which git history can check; otherwise the first commit of
the YAML whose registration hashes to the one before any amendment. A full run refuses a registration no commit
holds, so every result is made after its registration is in the history.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from sim.registration import Registration, registration_hash


def git(cwd: Path, *args: str) -> str | None:
    """``git args`` in ``cwd``'s repository; None outside one or on an error."""
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def head(cwd: Path) -> str | None:
    """The commit checked out (short form)."""
    return git(cwd, "rev-parse", "--short=10", "HEAD")


def base_hash(reg: Registration, current: str) -> str:
    """The hash of the registration before its first hashed amendment (the one first registered)."""
    return next((a.before for a in reg.amendments if a.before), current)


def registered_at(reg: Registration, path: Path, current: str) -> dict[str, str] | None:
    """{commit, date, where} of the registration's first commit (module docstring), or None if no commit holds it."""
    if reg.registered is not None:
        return {"commit": reg.registered.commit, "date": str(reg.registered.date), "where": reg.registered.where}
    want = base_hash(reg, current)
    log = git(path.parent, "log", "--reverse", "--format=%H %cs", "--", path.name) or ""
    top = git(path.parent, "rev-parse", "--show-toplevel")
    for line in log.splitlines():
        commit, date = line.split()
        rel = path.resolve().relative_to(Path(top)) if top else path
        text = git(path.parent, "show", f"{commit}:{rel}")
        try:
            mapping = yaml.safe_load(text or "") or {}
        except yaml.YAMLError:
            continue
        if isinstance(mapping, dict) and registration_hash(mapping) == want:
            return {"commit": commit[:10], "date": date, "where": str(rel)}
    return None


def first_result(pairs: dict[str, dict[int, dict[str, Any]]], results: Path) -> str | None:
    """The commit of the earliest pair that records one; for pairs made before the driver recorded commits, the
    commit that first added the result JSON."""
    ran = sorted((p["ran"], p["commit"]) for seeds in pairs.values() for p in seeds.values() if p.get("commit"))
    legacy = any("commit" not in p for seeds in pairs.values() for p in seeds.values())
    if legacy:
        added = git(results.parent, "log", "--diff-filter=A", "--format=%h", "--", results.name)
        if added:
            return added.splitlines()[-1]
    return ran[0][1] if ran else None


def check_results(old: dict[str, Any] | None, reg: Registration, current: str, path: Path) -> None:
    """Refuse results made under another registration: their hash must be the current one or one an amendment
    replaced. Results from before registrations were hashed (no hash) are adopted."""
    made = ((old or {}).get("registration") or {}).get("hash")
    if made is None or made in reg.accepted_hashes(current):
        return
    raise SystemExit(
        f"{path} was made under registration {made}; this one is {current}. A registration does not change after "
        f"its first result: undo the change, or record it as an amendment in the YAML's registration "
        f"(amendments: [{{date: YYYY-MM-DD, before: {made}, change: what changed, why, and what had been read}}])."
    )
