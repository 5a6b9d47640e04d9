"""RAO's policy-gradient update on stored rollouts: TRL's GRPOTrainer, fed our rows instead of generations.

TRL computes the loss (`loss_type`, CISPO by default, the RAO reference) and runs the loop (gradient
accumulation, clipping, AdamW, bf16, gradient checkpointing, LoRA). The subclass only swaps the data
side: the dataloader yields pre-packed micro-batches (see samples.py) and `_prepare_inputs` moves
them to the device instead of generating and scoring completions. `_compute_loss` is TRL's, untouched;
a thin wrapper around its log-prob helper fills in behaviour log-probs for scripted rows and records
ratio statistics. With `train.beta` > 0, `_prepare_inputs` also fills in the reference log-probs
that TRL's KL term reads: those of version 0 (a frozen copy, or the LoRA base with the adapter off).
Tested against TRL 1.16.0 exactly (pinned in pyproject.toml): the inputs dict and the normaliser
are private TRL details that may change between versions.

Under `accelerate launch` (N processes: DDP, FSDP or DeepSpeed) every rank builds the same plan and
takes its share of each optimiser step (`samples.rank_batches`); the prepared model all-reduces gradients and
`train_rows` sums the metrics over ranks, so rank 0 reports the numbers of the whole round.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import trl.trainer.utils as trl_utils
from accelerate.utils import DistributedType, is_peft_model
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PrinterCallback,
    TrainerCallback,
)
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head

from rao_core.allocator import keep_freed_memory
from rao_core.config import TrainConfig
from rao_core.train.cpu_fsdp import allow_fsdp_on_cpu
from rao_core.train.cpu_head import DeviceLogProbs
from rao_core.train.flops import flop_shape, train_flops
from rao_core.train.offpolicy import KLGuard, behaviour_weights, trust_region_mask
from rao_core.train.round_metrics import round_metrics
from rao_core.train.samples import Row, logprob_temperature, plan_steps, rank_batches
from rao_core.train.trl_args import grpo_args, lora_config, world
from rao_core.versions import require_tested

# RAOTrainer overrides TRL's private `_prepare_inputs`, `_get_per_token_logps_and_entropies` and
# `_compute_loss`, and fills the inputs dict they read: checked against this exact version, with
# tests/train/test_loss.py (the loss and gradients against a plain-PyTorch reference) as the guard.
require_tested(
    "trl", "1.16.0", "rao_core.train.trainer (GRPOTrainer's private methods)", "tests/train/test_loss.py"
)

# TRL's fused LM head scores only the labelled positions where Triton runs (CUDA) and every position
# elsewhere: on a CPU the head's tiles then cover the prompt and the observations too. The rows below
# label only the action tokens (the only ones the loss reads), so scoring just those is the same
# loss and gradient for a fraction of the head's work (a 49,152-token vocabulary makes the head a
# third of a 135M model's step; docs/training.md, "Throughput"). This is the name TRL's head reads
# for that choice alone (trl/trainer/utils.py, 1.16.0); on CUDA it was already true.
trl_utils._use_triton = lambda device: True
# And on a CPU its vocabulary tiles give way to whole-vocabulary bf16 matmuls (cpu_head.py).
trl_utils._ChunkedLogProbFunction = DeviceLogProbs(trl_utils._ChunkedLogProbFunction)


def _scored_in_sql(*args: Any, **kwargs: Any) -> list[float]:
    """GRPOTrainer demands a reward source; ours is the `scores` table, so this is never called."""
    raise RuntimeError("RAO rewards come from the scores table, not from a TRL reward function")


class RAOTrainer(GRPOTrainer):
    """GRPOTrainer whose batches are stored rollout rows, already packed into micro-batches.

    Each input dict carries prompt_ids/prompt_mask, completion_ids/completion_mask (real tokens),
    tool_mask (action tokens: TRL multiplies it into the loss mask), advantages (B,) = w_d * A,
    old_per_token_logps (sampler log-probs), sampler_missing (B,) and num_items_in_batch.

    With `beta` > 0 TRL's loss adds beta * KL(pi || pi_ref) per action token (its k3 estimator times
    the importance ratio: the unbiased reverse-KL gradient), pi_ref being `reference`, or the model
    with its adapter disabled when `reference` is None and the model is a peft model.
    """

    def __init__(
        self,
        model: PreTrainedModel | str,
        args: GRPOConfig,
        batches: list[dict[str, torch.Tensor]],
        processing_class: PreTrainedTokenizerBase,
        peft_config: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizer_state: dict[str, Any] | None = None,
        beta: float = 0.0,
        reference: PreTrainedModel | None = None,
        cfg: TrainConfig | None = None,
        kl_history: list[float] | None = None,
    ) -> None:
        self._batches = batches
        self.cfg = cfg or TrainConfig()  # the off-policy corrections and the guard (offpolicy.py)
        self.kl_history = kl_history  # None: no guard (a round of fresh trees, or a direct caller)
        self.guard: dict[str, Any] = {}  # what the KL guard did this round, if it tripped
        self._served = 0  # micro-batches prepared so far
        self._proximal: dict[int, torch.Tensor] | None = None  # pi_prox of the later steps' micro-batches
        self._optimizer_state = optimizer_state
        self._inputs: dict[str, torch.Tensor] | None = None
        self.stats: dict[str, float] = defaultdict(float)
        self.first_step_diffs: list[torch.Tensor] = []  # |trainer - sampler log-prob| before any update
        self.step_losses: list[float] = []
        super().__init__(
            model=model,
            reward_funcs=[_scored_in_sql],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": [""] * len(batches)}),  # only its length is read
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
        )
        self.remove_callback(PrinterCallback)  # metrics come back from train_rows instead of stdout
        if self.cfg.weighs_tokens:
            # TRL multiplies `importance_sampling_ratio` into its per-token loss when the samples come
            # from an engine apart from the trainer (its vLLM path): ours always do
            self.use_vllm = self.vllm_importance_sampling_correction = True
        if self.cfg.kl_guard != "off" and kl_history is not None:
            self.add_callback(KLGuard(self))
        self.beta = beta  # read by TRL's _compute_loss; its config's beta stays 0 (no reference of its own)
        self.reference = None
        if beta and reference is not None:
            self.reference = reference.to(self.accelerator.device).eval().requires_grad_(False)
            # as TRL prepares its own ref_model: log-probs from a fused head at the sampling temperature
            add_fused_lm_head(
                self.reference, temperature=self.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32
            )
        elif beta and not is_peft_model(self.accelerator.unwrap_model(self.model)):
            raise ValueError(
                "train.beta > 0 needs a reference model (version 0) or a LoRA adapter to disable"
            )

    def _send_telemetry(self) -> None:  # the training stage never reaches the network
        return None

    def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
        """AdamW, resumed from the previous round's moments when given: the campaign is then one
        long optimisation, as in the paper, instead of a fresh Adam per round (whose first steps
        move every weight by about lr, whatever its gradient). Hyperparameters come from this
        round's config, never from the saved state."""
        optimizer = super().create_optimizer(*args, **kwargs)
        if self._optimizer_state is not None:
            saved = self._optimizer_state
            groups = [
                {**new, "params": old["params"]}
                for new, old in zip(optimizer.param_groups, saved["param_groups"], strict=True)
            ]
            optimizer.load_state_dict({"state": saved["state"], "param_groups": groups})
        return optimizer

    def get_train_dataloader(self) -> DataLoader:
        """The micro-batches in plan order; batch_size=None yields each dict as is (no collation)."""
        return DataLoader(self._batches, batch_size=None, shuffle=False)

    def _prepare_inputs(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Replaces generation + scoring: the rollouts are already scored, just move them to the device
        (and, for the KL term, add the reference model's log-probs of the same tokens)."""
        if self.cfg.corrects and self._proximal is None:  # before the round's first update
            self._proximal = self._proximal_logps()
        index, self._served = self._served, self._served + 1
        inputs = {k: v.to(self.accelerator.device) for k, v in inputs.items()}
        if self._proximal and index in self._proximal:
            inputs["proximal_logps"] = self._proximal[index].to(self.accelerator.device)
        if self.beta:
            inputs["ref_per_token_logps"] = self._reference_logps(inputs)
        return inputs

    @torch.no_grad()
    def _logps_of(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """log-probs of every action token under `model`, computed as TRL computes the policy's."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_ids"].size(1)
        scored = inputs["completion_mask"] * inputs["tool_mask"]
        return self._get_per_token_logps_and_entropies(model, ids, mask, keep, scored=scored)[0]

    def _reference_logps(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """log pi_ref, the KL term's reference (version 0)."""
        if self.reference is not None:
            return self._logps_of(self.reference, inputs)
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # the LoRA base = version 0
            return self._logps_of(self.model, inputs)

    def _proximal_logps(self) -> dict[int, torch.Tensor]:
        """pi_prox of the micro-batches that later optimiser steps train on, computed now, before the
        round's first update. The first step's micro-batches need no pass of their own: the model has
        not moved yet when the loss computes them (pi_prox = pi, detached)."""
        accum = self.args.gradient_accumulation_steps
        device = self.accelerator.device
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            return {
                i: self._logps_of(self.model, {k: v.to(device) for k, v in batch.items()}).cpu()
                for i, batch in enumerate(self._batches)
                if i >= accum
            }

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        scored: torch.Tensor | None = None,
        **multimodal: Any,
    ) -> Any:
        """TRL's log-probs of the completion tokens, through its fused LM head, for the action tokens
        only (`scored`, else the inputs' completion_mask x tool_mask; other positions get 0: the
        loss never reads them). Behaviour log-probs of scripted rows become these (detached: ratio = 1).

        TRL's own version labels every completion token; ours is its text-only path with the labels
        narrowed to the actions (rows carry no images)."""
        if any(v is not None for v in multimodal.values()):
            raise NotImplementedError("RAO rows are text only")
        inputs = self._inputs
        if scored is None and inputs is not None:
            scored = inputs["completion_mask"] * inputs["tool_mask"]
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, :-logits_to_keep] = -100
        if scored is not None:
            labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(scored == 0, -100)
        router = {"output_router_logits": True} if compute_aux_loss else {}  # MoE load-balancing loss
        with self.accelerator.autocast():
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                labels=labels,
                fused_lm_head=True,
                **router,
            )
        logps = out.log_probs[:, -logits_to_keep:]
        entropies = out.entropy[:, -logits_to_keep:] if compute_entropy else None
        aux = out.aux_loss if compute_aux_loss else None
        if inputs is not None:
            cur = logps.detach()
            missing = inputs["sampler_missing"][:, None]
            mask = inputs["completion_mask"] * inputs["tool_mask"]
            mu = torch.where(missing, cur, inputs["old_per_token_logps"].to(cur.dtype))  # the sampler's
            old = mu  # what the loss's ratio is taken against
            weight = torch.ones_like(cur, dtype=torch.float)
            if self.cfg.corrects:
                prox = inputs.get("proximal_logps", cur).to(cur.dtype)  # the first step: the model as is
                behaviour = torch.where(missing, prox, mu)  # scripted rows: no sampler to correct for
                weight, counts = behaviour_weights(prox, behaviour, mask, self.cfg)
                for key, n in counts.items():
                    self.stats[key] += n
                old = prox if self.cfg.proximal_anchor else behaviour
            if self.cfg.trust_region is not None:
                out = trust_region_mask(cur, old, inputs["advantages"], mask, self.cfg.trust_region)
                weight = weight.masked_fill(out, 0.0)
                self.stats["trust_masked"] += float(out.sum())
            if self.cfg.weighs_tokens:
                inputs["importance_sampling_ratio"] = weight.to(cur.dtype)
            inputs["old_per_token_logps"] = old
            self._record_ratios(cur, old, mu, mask, inputs["sampler_missing"])
            if "ref_per_token_logps" in inputs:  # the KL estimate TRL adds to the loss (k3, at ratio 1)
                delta = inputs["ref_per_token_logps"] - cur
                self.stats["kl_sum"] += float(((torch.exp(delta) - delta - 1) * mask).sum())
        return logps, entropies, aux

    @torch.no_grad()
    def _record_ratios(
        self,
        cur: torch.Tensor,
        old: torch.Tensor,
        mu: torch.Tensor,
        mask: torch.Tensor,
        missing: torch.Tensor,
    ) -> None:
        """Ratio statistics of the loss (pi / old) and, before any update, the sampler mismatch
        (pi against the sampler's mu)."""
        m = mask.bool()
        ratio = torch.exp(cur - old)[m].float()
        if self.loss_type in ("cispo", "vespo"):
            clipped = ratio > self.epsilon_high
        else:
            clipped = (ratio < 1 - self.epsilon_low) | (ratio > 1 + self.epsilon_high)
        self.stats["tokens"] += float(m.sum())
        self.stats["ratio_sum"] += float(ratio.sum())
        self.stats["ratio_sq_sum"] += float((ratio**2).sum())
        self.stats["clipped"] += float(clipped.sum())
        self.stats["logp_sum"] += float(cur[m].sum())
        sampled = m & ~missing[:, None]  # rows with the sampler's own log-probs
        if self.state.global_step == 0:  # before any update: the sampler against this version
            log_ratio = (cur - mu)[sampled].float()
            self.first_step_diffs.append(log_ratio.abs().cpu())
            self.stats["first_tokens"] += float(sampled.sum())
            self.stats["first_diff_sum"] += float(log_ratio.abs().sum())
            # k3 estimate of KL(sampler || trainer) on the sampler's tokens: r - 1 - log r, r = p/q
            # (float64 and expm1: for |log r| ~ 1e-6 the terms cancel below float32's precision)
            x = log_ratio.double()
            self.stats["first_k3_sum"] += float((torch.expm1(x) - x).sum())

    def _compute_loss(self, model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """TRL's loss, unchanged; we only keep a handle on the inputs and sum the step's loss."""
        self._inputs = inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._inputs = None
        if self.model.training:
            accum = self.args.gradient_accumulation_steps
            if self._step % accum == 0:
                self.step_losses.append(0.0)
            self.step_losses[-1] += float(loss.detach())
        return loss


def _trained_model(trainer: RAOTrainer) -> PreTrainedModel | None:
    """The trained weights: on every rank under DDP, on rank 0 only when sharded (a LoRA model
    comes back as base + adapter, unmerged: the adapter is what the next round trains on).

    Under FSDP and ZeRO-3 each rank holds a shard: gathering the full state dict is collective (every
    rank calls this), then rank 0 loads it into a fresh float32 copy of the architecture. Under DDP,
    and in one process, every rank already holds the whole model.
    """
    acc = trainer.accelerator
    # keep_fp32_wrapper=False: under bf16 accelerate wraps forward in autocast; the probe and the
    # next user of this model compute with the weights as they are
    model = acc.unwrap_model(trainer.model_wrapped, keep_fp32_wrapper=False)
    if acc.distributed_type not in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return model
    state = acc.get_state_dict(trainer.model_wrapped)
    if not acc.is_main_process:
        return None
    if acc.distributed_type == DistributedType.DEEPSPEED:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()  # or from_config would partition the copy again (a collective)
    plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(state)
    return plain


def _check_launch(trainer: RAOTrainer, cfg: TrainConfig, rank: int, world_size: int) -> bool:
    """Whether the model is sharded (FSDP / ZeRO-3), or a clear error for what sharding cannot do."""
    acc = trainer.accelerator
    if (acc.process_index, acc.num_processes) != (rank, world_size):
        raise RuntimeError(
            f"RANK/WORLD_SIZE say {rank}/{world_size}, accelerate {acc.process_index}/{acc.num_processes}"
        )
    sharded = acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    if cfg.lora and sharded:
        raise NotImplementedError(
            "train.lora is not supported with FSDP / DeepSpeed: use DDP (an adapter is small) or full fine-tuning"
        )
    if cfg.beta and sharded:
        raise NotImplementedError(
            "train.beta > 0 is not supported with FSDP / DeepSpeed (the reference is not sharded): use DDP"
        )
    return sharded


def train_rows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[Row],
    cfg: TrainConfig,
    work_dir: Path,
    callbacks: list[TrainerCallback] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    reference: PreTrainedModel | None = None,
    kl_history: list[float] | None = None,
) -> tuple[PreTrainedModel | None, dict[str, Any]]:
    """Run one round's update on `rows`; returns the trained model and metrics. With
    `cfg.lora`, `model` is either a peft model (the adapter trains on) or a plain one (a fresh
    adapter is put on it). `reference`: version 0, the KL term's pi_ref when `cfg.beta` > 0
    (with LoRA the base model is, and `reference` is not needed). `kl_history`: the earlier rounds'
    sampler mismatch KLs, which `cfg.kl_guard` judges this round's against; None turns it off. The
    stage settles `auto` by the trees' staleness (`TrainConfig.for_round`); here rows count as fresh.

    Launched on N processes, every rank passes the same rows and gets the metrics of the whole round;
    the model comes back on every rank under DDP and on rank 0 only under FSDP / ZeRO-3 (None
    elsewhere). Exact equality with one process holds for the token-mean losses (cispo, dapo, vespo);
    the per-micro-batch losses (grpo, bnpo, ...) average over a different set of micro-batches."""
    cfg = cfg.with_auto(acting=cfg.corrections == "every_round")  # a no-op after for_round
    keep_freed_memory()  # the step's large tensors are reused, not faulted in again (allocator.py)
    torch.manual_seed(cfg.seed)
    plan = plan_steps(rows, cfg.max_tokens_per_microbatch, cfg.steps_per_round, cfg.seed)
    metrics: dict[str, Any] = {"samples": len(rows), "trained_samples": 0, "steps": 0, "tokens": 0}
    if not plan:
        return model, {**metrics, "skipped": "no trainable action tokens"}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rank, world_size = world()
    batches = rank_batches(rows, plan, pad_id, rank, world_size)
    accum = max(-(-len(step) // world_size) for step in plan)
    max_completion = max(
        max(rows[i].length for i in mb) - min(rows[i].first_action for i in mb)
        for step in plan
        for mb in step
    )
    temperature = logprob_temperature(rows)
    args = grpo_args(cfg, work_dir, accum, max_completion, temperature)
    peft_config = lora_config(cfg) if cfg.lora and not is_peft_model(model) else None
    shape = flop_shape(model)  # before the trainer wraps (or shards) it
    allow_fsdp_on_cpu()  # a CPU launch that asks for FSDP shards (cpu_fsdp.py)
    trainer = RAOTrainer(
        model,
        args,
        batches,
        tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
        optimizer_state=optimizer_state,
        beta=cfg.beta,
        reference=None if cfg.lora else reference,
        cfg=cfg,
        kl_history=kl_history,
    )
    sharded = _check_launch(trainer, cfg, rank, world_size)
    device = trainer.accelerator.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    used = sorted({i for step in plan for mb in step for i in mb})
    flops = train_flops(shape, (rows[i].length for i in used), frozen=cfg.lora, reference=bool(cfg.beta))
    metrics.update(
        **round_metrics(trainer, plan, [r.length for r in rows], seconds, flops),
        trained_samples=len(used),
        grad_accum=accum,
        loss_type=cfg.loss_type,
        lr=cfg.lr,
        temperature=temperature,
        device=str(device),
        bf16=bool(args.bf16),
    )
    if device.type == "cuda":
        metrics["peak_gpu_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if cfg.keep_optimizer_state and not sharded:
        metrics["optimizer_state"] = trainer.optimizer.state_dict()  # popped and saved by the stage
    return _trained_model(trainer), metrics
