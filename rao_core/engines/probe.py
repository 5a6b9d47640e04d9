"""A fixed probe prompt and its log-probs under a checkpoint: how an engine proves which weights it serves.

The training stage writes `probe.json` into every checkpoint it saves (token ids and the per-token
log-probs of the probe text at temperature 1, computed by the trainer's own model in float32).
After loading a version, the vLLM engine asks the server for the same log-probs (`prompt_logprobs`)
and compares: stale weights (a reload that did not take, the tied-embedding bug of vLLM's CPU
backend) differ by far more than numerical noise, and stop the rollout.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PROBE = "probe.json"
PROBE_TEXT = (
    "You are an agent that solves tasks by writing Python in a REPL.\n"
    "Goal: make e73\n<python>\ninfo('e73')\n</python>\ne73 <- s14, z98; have 0; missing z98\n"
    "<python>\nsub('z98')\n</python>\nmade z98\n<python>\ncraft('e73')\n</python>\n"
)


def probe_ids(tokenizer) -> list[int]:
    return tokenizer.encode(PROBE_TEXT, add_special_tokens=False)


@torch.no_grad()
def probe_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, temperature 1, in float32."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(ids[1:], device=device)[:, None]).squeeze(1).tolist()


def write_probe(model, tokenizer, folder: Path) -> None:
    ids = probe_ids(tokenizer)
    data = {"token_ids": ids, "logprobs": probe_logprobs(model, ids)}
    (Path(folder) / PROBE).write_text(json.dumps(data))


def read_probe(folder: Path) -> dict | None:
    path = Path(folder) / PROBE
    return json.loads(path.read_text()) if path.is_file() else None


def checkpoint_probe(folder: Path) -> dict:
    """The checkpoint's probe: its probe.json, or computed now (a shipped or given checkpoint)."""
    found = read_probe(folder)
    if found is not None:
        return found
    from transformers import AutoTokenizer

    from rao_core.models.loading import load_causal_lm

    model = load_causal_lm(folder, dtype=torch.float32)
    ids = probe_ids(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    return {"token_ids": ids, "logprobs": probe_logprobs(model.eval(), ids)}
