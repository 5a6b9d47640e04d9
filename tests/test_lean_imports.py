"""rao_core/lean_imports.py: transformers loads without importing scikit-learn, which stays usable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
{before}
import rao_core
{load}
import transformers
print(int("sklearn" in sys.modules), int(transformers.is_sklearn_available()))
"""
MODEL = "from transformers import AutoModelForCausalLM"  # all of it, transformers.generation included


def probe(before: str = "", load: str = MODEL, **env: str) -> str:
    code = PROBE.format(before=before, load=load)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_transformers_loads_without_sklearn_which_still_works():
    code = "import sklearn.metrics; print(sklearn.metrics.roc_curve([0, 1], [0.2, 0.8])[0].tolist())"
    assert probe(load=f"{MODEL}\nprint(int('sklearn' in sys.modules))\n{code}") == "0\n[0.0, 0.0, 1.0]\n1 0"


@pytest.mark.parametrize(
    ("before", "env", "seen"),
    [
        ("", {"RAO_TRANSFORMERS_SKLEARN": "1"}, "0 1"),  # asked for: transformers sees it
        ("import sklearn", {}, "1 1"),  # imported before: left as it is
    ],
)
def test_the_usual_behaviour_when_asked_or_already_imported(before, env, seen):
    assert probe(before, load="import transformers.utils", **env) == seen
