"""One model load at a time in a process.

transformers builds a model under process-wide initialisation contexts (weights first on the meta
device), so two `from_pretrained` running at once on two threads can leave one model's parameters
on the meta device ("Cannot copy out of meta tensor"). That happens when rounds overlap
(campaign.max_staleness >= 1) with the engine in this process: the engine lane loads the next
version while the trainer loads the one it trains. Every load of the package goes through
`load_causal_lm`, or holds `LOADING` around its own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

LOADING = threading.Lock()


def load_causal_lm(path: str | Path, **kwargs: Any) -> Any:
    """`AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)`, one at a time."""
    from transformers import AutoModelForCausalLM

    with LOADING:
        return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs)
