"""RAO: Recursive Agent Optimization (README.md). Old import paths of public names that moved keep
working, with a FutureWarning naming the new one (rao_core/public.py); transformers loads without
its scikit-learn import (rao_core/lean_imports.py)."""

from rao_core.lean_imports import install as _lean_transformers
from rao_core.public import install as _install_old_paths

_lean_transformers()
_install_old_paths()
