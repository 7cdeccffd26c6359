"""Which code produced an experiment's files: the git commit of the checkout (no heavy imports)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["code_version"]


def code_version(root: Path = ROOT) -> dict[str, Any] | None:
    """The git commit of the checkout at ``root`` and whether its code differs from it.

    Returns:
      ``{"commit": SHA, "dirty": [changed tracked files under jaxrl_mt/ and configs/]}``, or None
      when ``root`` is not a git checkout (or git is missing): an experiment's files then say so
      rather than name a commit that did not produce them.
    """
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "jaxrl_mt", "configs"],
                            cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": sha.stdout.strip(), "dirty": sorted(line[3:] for line in st.stdout.splitlines() if line)}
