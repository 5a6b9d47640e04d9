"""Training throughput: the model FLOPs of a round, the TFLOP/s achieved and, on a known GPU, MFU.

Model FLOPs follow the MFU convention (PaLM, appendix B): the matrix multiplications one forward
and one backward pass of the model need for the trained tokens, whatever the implementation does.
Not counted: gradient checkpointing's recompute, the fused LM head's recomputed tiles in backward,
padding, the optimizer step. Those are the implementation's costs, which MFU is meant to expose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

# Dense bf16 tensor-core peak per GPU in TFLOP/s, no sparsity (vendor datasheets); first match wins.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200|H200", 989.0),
    (r"H100.*PCIe", 756.0),
    (r"H100.*NVL", 835.0),
    (r"H100|H800", 989.0),
    (r"B200", 2250.0),
    (r"A100|A800", 312.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
)


@dataclass(frozen=True)
class FlopShape:
    """What the count needs of a dense decoder."""

    matmul_params: int  # weights of every nn.Linear: the non-embedding matrices and the LM head
    layers: int
    attention_width: int  # query heads x head dim (the hidden size in most models)


def flop_shape(model: torch.nn.Module) -> FlopShape:
    """The shape of a Hugging Face causal LM (a peft model too: its adapters count, they are tiny).

    Counted from the modules rather than the config so that the LM head counts once whether or not it
    is tied to the embedding, and the embedding (a lookup, no FLOPs) not at all."""
    c = model.config.get_text_config()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return FlopShape(params, c.num_hidden_layers, c.num_attention_heads * head_dim)


def train_flops(
    shape: FlopShape, lengths: Iterable[int], frozen: bool = False, reference: bool = False
) -> float:
    """Model FLOPs of training once on sequences of these lengths (unpadded).

    Per sequence of s tokens, with N = `matmul_params`, L layers and attention width a:

        forward   2 N s + 4 L a s^2     one multiply-add per weight and token; Q K^T and P V
        backward  4 N s + 8 L a s^2     gradients of the activations and of the weights

    = 6 N s + 12 L a s^2: per token 6 N + 12 L a s, PaLM's 6N + 12LHQT with T = the token's own
    sequence length, so the attention term averages over the actual lengths (the sum of s^2), not
    the padded width. Attention counts the full s x s scores, as PaLM and torch's FlopCounterMode
    do, though a causal kernel needs about half. `frozen` (LoRA): no weight gradients, 4 N s
    instead of 6 N s (the adapter's own FLOPs left out); `reference` (train.beta > 0): one more
    forward, of version 0.
    """
    tokens = squares = 0
    for s in lengths:
        tokens, squares = tokens + s, squares + s * s
    n, attention = shape.matmul_params, shape.layers * shape.attention_width
    forward = 2 * n * tokens + 4 * attention * squares
    backward = (2 if frozen else 4) * n * tokens + 8 * attention * squares
    return float(forward + backward + (forward if reference else 0))


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (torch.cuda.get_device_name), None when unknown."""
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS if re.search(pattern, device_name)), None)


def throughput(flops: float, seconds: float, device: torch.device, processes: int = 1) -> dict[str, float]:
    """`model_flops` and `tflops` (achieved over `seconds`, all processes together); on a GPU of the
    table also its `peak_tflops_bf16` and `mfu` = tflops / (peak x processes), against the bf16
    peak whatever the precision trained in."""
    out = {"model_flops": flops, "tflops": flops / max(seconds, 1e-9) / 1e12}
    if device.type == "cuda":
        peak = peak_bf16_tflops(torch.cuda.get_device_name(device))
        if peak:
            out.update(peak_tflops_bf16=peak, mfu=out["tflops"] / (peak * processes))
    return out
