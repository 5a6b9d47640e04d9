"""Log-probs of the action tokens through the LM head, on a CPU: whole-vocabulary matmuls in the
autocast dtype instead of TRL's vocabulary tiles.

TRL's fused head (trl/kernels/chunked_logprob.py) never materialises the (tokens, vocabulary)
logits: it projects 32,768-entry vocabulary tiles and folds each into running statistics, and in
backward it recomputes each tile and accumulates both gradient products in float32. On a GPU that
is right. On a CPU there is no float32-output bf16 matmul, so those accumulations run as float32
matmuls (a bf16 matmul is 3-8x faster on CPUs with AMX), and every tile is walked by several
elementwise passes. With only the action tokens scored (trainer.py), the whole vocabulary of a
chunk of 1,024 tokens fits in memory, so here each chunk is one matmul in the compute dtype, one
log-softmax in float32, and in backward the recomputed chunk's gradient goes through two matmuls
in the compute dtype: what autocast does for any linear layer. Same signature and outputs as
TRL's function; the tests compare the two (tests/train/test_cpu_head.py).
"""

from __future__ import annotations

from typing import Any

import torch

TOKEN_CHUNK = 1024  # tokens per chunk: its float32 logits are 1,024 x V x 4 B (201 MB at 49,152)


def _logits(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, scale: float, softcap, inv_t: float):
    """(scaled, capped, tempered logits in float32, tanh of the cap or None), in place where it can:
    each pass over a chunk's logits costs as much as the matmul that made them."""
    y = (h @ w.t()).float()
    if bias is not None:
        y += bias.float()
    t = None
    if softcap is not None:
        y.mul_(scale / softcap)
        t = y.tanh_()
        y = t * (softcap * inv_t)
    elif scale * inv_t != 1.0:
        y.mul_(scale * inv_t)
    return y, t


class CPULogProbs(torch.autograd.Function):
    """TRL's `ChunkedLogProbFunction` contract: (hidden [N, H], weight [V, H], bias, targets [N],
    temperature, chunk_size, softcap, logit_scale, outputs) -> (log_probs, entropy, log_sum_sq_probs,
    mean_logits, is_top1), the last four None unless `outputs` names them (only "entropy" and
    "log_probs" are supported here)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = ("log_probs",),
    ):
        unsupported = set(outputs) - {"log_probs", "entropy"}
        if unsupported:
            raise NotImplementedError(f"CPU LM head: outputs {sorted(unsupported)}")
        cast = torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cpu") if cast else hidden.dtype
        w = weight.to(dtype)
        args = (logit_scale, final_logit_softcapping, 1.0 / temperature)
        log_z, logp, entropy = [], [], []
        with torch.autocast("cpu", enabled=False):
            for start in range(0, hidden.shape[0], TOKEN_CHUNK):
                h, tgt = hidden[start : start + TOKEN_CHUNK].to(dtype), targets[start : start + TOKEN_CHUNK]
                z, _ = _logits(h, w, bias, *args)
                top = z.amax(dim=-1, keepdim=True)
                target = z.gather(1, tgt[:, None]).squeeze(1)
                e = z.sub_(top).exp_()  # z is spent: exp(z - max), in place
                total = e.sum(-1)
                lz = top.squeeze(1) + total.log()
                log_z.append(lz)
                logp.append(target - lz)
                if "entropy" in outputs:  # log Z - E_p[z], with z = log e + max
                    mean_shifted = (e * e.clamp_min(1e-45).log()).sum(-1) / total
                    entropy.append(lz - top.squeeze(1) - mean_shifted)
        log_z_all = torch.cat(log_z) if log_z else hidden.new_zeros(0, dtype=torch.float32)
        ent = (torch.cat(entropy) if entropy else log_z_all.clone()) if "entropy" in outputs else None
        ctx.save_for_backward(hidden, weight, bias, targets, log_z_all, log_z_all if ent is None else ent)
        ctx.dtype, ctx.args = dtype, args
        logprobs = torch.cat(logp) if logp else log_z_all.clone()
        return logprobs, ent, None, None, None

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_ent: torch.Tensor | None, *_: Any):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        dtype, (scale, softcap, inv_t) = ctx.dtype, ctx.args
        w = weight.to(dtype)
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_b = (
            torch.zeros(bias.shape, dtype=torch.float32)
            if bias is not None and ctx.needs_input_grad[2]
            else None
        )
        with torch.autocast("cpu", enabled=False):
            for start in range(0, hidden.shape[0], TOKEN_CHUNK):
                end = start + TOKEN_CHUNK
                h = hidden[start:end].to(dtype)
                z, t = _logits(h, w, bias, scale, softcap, inv_t)
                p = z.sub_(log_z[start:end, None]).exp_()  # softmax, in place of the logits
                if grad_ent is not None:  # d entropy / dz = -p (log p + entropy), before p is reused
                    ge = grad_ent[start:end].float()[:, None]
                    g_ent = p * (p.clamp_min(1e-45).log() + entropy[start:end, None]) * ge
                if grad_logp is not None:  # d log p_target / dz = onehot - p
                    gl = grad_logp[start:end].float()
                    g = p.mul_(-gl[:, None])
                    g.scatter_add_(1, targets[start:end, None], gl[:, None])
                else:
                    g = p.zero_()
                if grad_ent is not None:
                    g -= g_ent
                if t is not None:
                    g.mul_(1 - t * t)
                if scale * inv_t != 1.0:
                    g.mul_(scale * inv_t)
                g = g.to(dtype)
                if grad_h is not None:
                    grad_h[start:end] = (g @ w).float()
                if grad_w is not None:
                    grad_w += (g.t() @ h).float()
                if grad_b is not None:
                    grad_b += g.float().sum(0)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *([None] * 6),
        )


class DeviceLogProbs:
    """TRL's head function on every device but the CPU, CPULogProbs there (an `.apply` like theirs)."""

    def __init__(self, trl_function: Any) -> None:
        self.trl_function = trl_function

    def apply(self, hidden: torch.Tensor, *args: Any) -> Any:
        outputs = args[7] if len(args) > 7 else ("log_probs",)
        if hidden.device.type == "cpu" and set(outputs) <= {"log_probs", "entropy"}:
            return CPULogProbs.apply(hidden, *args)
        return self.trl_function.apply(hidden, *args)
