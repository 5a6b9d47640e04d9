"""RAO: Recursive Agent Optimization (README.md). Old import paths of public names that moved keep
working, with a FutureWarning naming the new one (rao_core/public.py)."""

from rao_core.public import install as _install_old_paths

_install_old_paths()
