"""transformers without its scikit-learn import: every process that loads a model starts faster.

transformers imports `sklearn.metrics` at import time wherever scikit-learn is installed (MLflow
installs it), for one option of assisted generation (`assistant_confidence_threshold`) that RAO
never uses. That import was 1.4 s of the 8.6 s a process spent importing torch, transformers,
MLflow and Prefect here (`python -X importtime`; docs/engines.md), and every `rao` command, engine
process and train stage pays it. The finder below, installed by rao_core/__init__, lets
transformers see scikit-learn as absent when it first loads; scikit-learn itself stays importable
for anything else. A process that imported scikit-learn before transformers keeps the usual
behaviour, and so does one started with RAO_TRANSFORMERS_SKLEARN=1.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType

TARGET = "transformers.utils.import_utils"  # where transformers decides what is installed


def _sklearn_absent() -> bool:
    return False


class TransformersWithoutSklearn(importlib.abc.MetaPathFinder):
    """Finds `TARGET` as the path finder would, and sets its `is_sklearn_available` to False once
    the module has run (before `transformers.utils` re-exports it)."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if "sklearn" not in sys.modules and hasattr(module, "is_sklearn_available"):
                module.is_sklearn_available = _sklearn_absent

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path, once, unless transformers is loaded already or
    RAO_TRANSFORMERS_SKLEARN=1 asks for the usual behaviour."""
    if TARGET in sys.modules or os.environ.get("RAO_TRANSFORMERS_SKLEARN") == "1":
        return
    if not any(isinstance(f, TransformersWithoutSklearn) for f in sys.meta_path):
        sys.meta_path.insert(0, TransformersWithoutSklearn())
