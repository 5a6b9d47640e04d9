"""The `train.*` section: the policy-gradient update of each round (rao_core/train/), and the
corrections for trees sampled by an older policy version (campaign.max_staleness >= 1).

Kept apart from sections.py, which holds the sections of the rollouts and the campaign.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import Field, StrictBool, model_validator

from rao_core.config.types import Device, Float, Int, Labels, NumberList, YamlOff, opt, section

# What `auto` means for trust_region and kl_guard where the corrections act: the combination that
# held up best at k = 1 on 3 rollout seeds and at k = 2 (docs/overlap.md, "12 rounds with eps 0.3
# and the guard").
STALE_TRUST_REGION = 0.3
STALE_KL_GUARD = "skip"
# Every correction and the guard switched off: a round of fresh trees under corrections=stale_rounds.
CORRECTIONS_OFF = {"token_mask": None, "sequence_mask": None, "proximal_anchor": False, "trust_region": None,
                   "kl_guard": "off"}  # fmt: skip
# The settings that matter only where the corrections act (their switches and their knobs).
CORRECTION_SETTINGS = (
    *CORRECTIONS_OFF,
    "behaviour_cap",
    "kl_guard_factor",
    "kl_guard_ceiling",
    "kl_guard_floor",
)

LossType = Literal["cispo", "grpo", "dr_grpo", "dapo", "bnpo", "sapo", "luspo", "vespo"]


@section
class TrainConfig:
    """The training stage. Reference (Qwen3-4B): AdamW lr 3e-6, betas (0.9, 0.95), wd 0.017, clip 1.0, bf16.

    The log-probs are taken at the temperature each node was sampled at (recorded in the nodes
    table), so there is no training temperature to keep in step with the sampler's."""

    loss_type: LossType = opt(
        "cispo", "TRL loss; cispo = -(sg(clip(ratio, 0, clip_high)) * A * log pi), token mean (the reference)"
    )
    lr: Float = opt(
        3e-4,
        "AdamW learning rate, constant within a round (the tiny model; the paper uses 3e-6 for 4B; 0 measures without updating)",
        ge=0,
        lt=1,
    )
    lr_final: Float = opt(
        1.0,
        "lr multiplier at the campaign's last round: the lr goes linearly from lr (round 0) to "
        "lr * lr_final (1: constant)",
        ge=0,
    )
    betas: Annotated[list[Annotated[Float, Field(ge=0, lt=1)]], NumberList] = opt(
        [0.9, 0.95], "AdamW betas (two numbers in [0, 1))", min_length=2, max_length=2
    )
    weight_decay: Float = opt(0.017, "AdamW weight decay", ge=0)
    max_grad_norm: Float = opt(1.0, "gradient clipping by global norm; 0 disables it", ge=0)
    clip_high: Float = opt(
        5.0, "cispo: cap of the importance ratio (TRL epsilon_high); others: upper epsilon", gt=0
    )
    clip_low: Float = opt(
        0.2, "grpo-family losses: lower clip epsilon (TRL epsilon); unused by cispo", ge=0, lt=1
    )
    beta: Float = opt(
        0.0,
        "KL coefficient toward policy version 0 (TRL's k3 term on action tokens); 0 = none, the RAO "
        "reference; > 0 keeps a frozen float32 copy of version 0 beside the policy (LoRA: the base)",
        ge=0,
    )
    bf16: StrictBool | None = opt(
        None,
        "bf16 autocast over fp32 master weights; null = on CUDA, and on a CPU with bf16 matrix units "
        "(AMX, AVX512-BF16) when the checkpoint is stored in bf16 (SmolLM2; not the fp32 tiny models)",
    )
    gradient_checkpointing: StrictBool = opt(False, "recompute activations in backward (long contexts)")
    fused_adamw: StrictBool | None = opt(
        None,
        "AdamW's fused kernel (torch fused=True), the same update up to rounding; null = on CUDA only "
        "(the CPU keeps the plain one, bit for bit)",
        resume="free",
    )
    lora: StrictBool = opt(
        False,
        "train a LoRA adapter over the frozen version-0 model (needs the lora extra: peft); the "
        "adapter and its optimizer state carry from round to round, and engines serve base + adapter",
    )
    lora_r: Int = opt(16, "LoRA rank", ge=1)
    lora_alpha: Int = opt(32, "LoRA alpha", ge=1)
    lora_dropout: Float = opt(
        0.0, "LoRA dropout (0 keeps sampler and trainer log-probs comparable)", ge=0, lt=1
    )
    lora_targets: Labels = opt(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "LoRA target modules",
        min_length=1,
    )
    max_tokens_per_microbatch: Int = opt(
        16384, "padded tokens (rows x longest row) per forward/backward", ge=1
    )
    keep_optimizer_state: StrictBool = opt(
        True,
        "carry AdamW's moments from round to round (trainer_state/optimizer.pt in the latest "
        "checkpoint: 2x the trained weights)",
    )
    steps_per_round: Int = opt(
        4, "optimiser steps per round: the batch is dealt into this many mini-batches", ge=1
    )
    seed: Int = opt(0, "seed of mini-batch dealing and of torch")
    device: Device = opt("auto", "cpu, cuda, cuda:N (GPU N) or auto", resume="free")
    accelerate_config: str = opt(
        "",
        "accelerate config file (configs/accelerate/*.yaml): the train stage then runs as its own "
        "`accelerate launch` on N processes (DDP/FSDP/ZeRO-3); empty = in the flow's process",
        resume="free",
    )
    launcher: Literal["accelerate", "torchrun"] = opt(
        "accelerate",
        "how an accelerate_config stage starts: accelerate launch, or torchrun (c10d, several nodes)",
        resume="free",
    )
    nnodes: Int = opt(1, "launcher torchrun: nodes (num_processes counts all ranks)", ge=1, resume="free")
    rdzv_endpoint: str = opt("", "launcher torchrun: host:port of the c10d rendezvous", resume="free")
    node_command: str = opt(
        "", "nnodes > 1: runs torchrun once per node ('srun --nodes=2 ...')", resume="free"
    )
    corrections: Literal["stale_rounds", "every_round"] = opt(
        "stale_rounds",
        "where token_mask, sequence_mask, proximal_anchor, trust_region and kl_guard act: stale_rounds = only in "
        "rounds that train on a tree sampled by an older version (campaign.max_staleness >= 1; at "
        "k = 0 they never act), every_round = also on fresh trees (the sampler-trainer mismatch)",
    )
    # Off-policy corrections (docs/overlap.md, "Corrections"). mu is the sampler's log-prob of a
    # token, pi_prox the trainer's under the version the round starts from (recomputed before the
    # round's first update), and the behaviour ratio is pi_prox / mu: 1 up to numerical noise at
    # k = 0, further from 1 the older the tree (campaign.max_staleness). The masks and the anchor are
    # off by default; the trust region and the guard are `auto` (on in stale rounds, measured); all
    # act in stale rounds only (corrections).
    token_mask: Float | None = opt(
        None,
        "c > 1: action tokens whose behaviour ratio lies outside [1/c, c] get no gradient; null = off",
        gt=1,
    )
    sequence_mask: Float | None = opt(
        None,
        "c > 1: nodes whose mean behaviour log-ratio lies outside [-log c, log c] get no gradient; null = off",
        gt=1,
    )
    proximal_anchor: StrictBool = opt(
        False,
        "decoupled PPO (AReaL): the loss's ratio and clip are taken around pi_prox instead of the "
        "sampler's mu, and each token is weighted by the behaviour ratio truncated at behaviour_cap",
    )
    behaviour_cap: Float = opt(2.0, "proximal_anchor: the cap of the behaviour ratio's weight", gt=0)
    trust_region: Annotated[Float, Field(gt=0, lt=1)] | Literal["auto"] | None = opt(
        "auto",
        "eps in (0, 1): PPO's clip as a mask on CISPO (MiniMax-M1's M_t): an action token whose "
        "ratio to the sampler (pi_prox under proximal_anchor) already left [1 - eps, 1 + eps] in the "
        "direction its advantage pushes gets no gradient; auto = 0.3 where the corrections act (k >= 1: "
        "kept 3 seeds from collapsing at k = 1, and seed 0 at k = 2 with the guard), off elsewhere; "
        "null = off (docs/overlap.md)",
    )
    kl_guard: Annotated[Literal["auto", "off", "skip", "scale"], YamlOff] = opt(
        "auto",
        "when the round's sampler mismatch KL jumps (> kl_guard_factor x the median of earlier "
        "rounds', or > kl_guard_ceiling; never below kl_guard_floor): skip = drop the round's trees "
        "(the version advances unchanged), scale = lr x threshold / KL for the round; auto = skip "
        "where the corrections act (k >= 1), off elsewhere (docs/overlap.md)",
    )
    kl_guard_factor: Float = opt(4.0, "kl_guard: a jump is this many times the earlier rounds' median", gt=1)
    kl_guard_ceiling: Float = opt(
        0.05, "kl_guard: a KL above this trips the guard whatever came before", gt=0
    )
    kl_guard_floor: Float = opt(
        1e-3, "kl_guard: a KL at or below this never trips it (numerical noise)", ge=0
    )

    @model_validator(mode="after")
    def _corrections_fit_the_loss(self) -> TrainConfig:
        if self.corrects and self.loss_type == "vespo":  # TRL folds the weight into VESPO's own
            raise ValueError(
                "train.loss_type: 'vespo': computes its own sequence weights; use token_mask, "
                "sequence_mask and proximal_anchor with cispo or the grpo family"
            )
        return self

    def with_auto(self, acting: bool) -> TrainConfig:
        """This config with `auto` settled: trust_region and kl_guard take the measured settings
        (STALE_TRUST_REGION, STALE_KL_GUARD) where the corrections act, off elsewhere."""
        settled = (
            {"trust_region": STALE_TRUST_REGION, "kl_guard": STALE_KL_GUARD} if acting else CORRECTIONS_OFF
        )
        return dataclasses.replace(
            self,
            **{key: settled[key] for key in ("trust_region", "kl_guard") if getattr(self, key) == "auto"},
        )

    def for_round(self, stale: bool) -> TrainConfig:
        """The config a round trains with: under corrections=stale_rounds, a round of fresh trees
        (k = 0, or a round before the first stale one) gets none; otherwise `auto` is settled."""
        if self.corrections == "stale_rounds" and not stale:
            return self.without_corrections()
        return self.with_auto(acting=True)

    def without_corrections(self) -> TrainConfig:
        """This config with every correction and the guard off: a round of fresh trees under
        corrections=stale_rounds."""
        return dataclasses.replace(self, **CORRECTIONS_OFF)

    @property
    def corrects(self) -> bool:
        """Whether any correction needs the behaviour ratio (and so pi_prox)."""
        return self.token_mask is not None or self.sequence_mask is not None or self.proximal_anchor

    @property
    def weighs_tokens(self) -> bool:
        """Whether the loss gets a per-token weight: a correction, or the trust region's mask."""
        return self.corrects or self.trust_region not in (None, "auto")
