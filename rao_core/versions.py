"""Where the code relies on a library's private internals, it names the exact version it was
written and tested against, and refuses another one with a message that says what to do."""

from __future__ import annotations

import importlib.metadata
import os


def require_tested(package: str, tested: str, user: str, guard: str) -> None:
    """ImportError unless `package` is exactly `tested` (or RAO_ALLOW_UNTESTED_<PACKAGE>=1 is set)."""
    found = importlib.metadata.version(package)
    override = f"RAO_ALLOW_UNTESTED_{package.upper()}"
    if found != tested and not os.environ.get(override):
        raise ImportError(
            f"{user} relies on {package} internals tested with {package}=={tested} only; found {found}. "
            f"Install {tested} (pyproject.toml pins it), or set {override}=1 and run {guard} first"
        )
