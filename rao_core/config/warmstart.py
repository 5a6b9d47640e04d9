"""The `warmstart.*` section: the tiny model's supervised warm start (rao_core/train/warmstart.py).

Kept apart from sections.py, which holds the sections of the RL run itself.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, model_validator

from rao_core.config.types import Float, Int, Labels, NumberList, opt, section


@section
class WarmStartConfig:
    """The warm start trained inside a run (`policy.model=warmstart`) or by `rao warmstart`: SFT on
    the suite's scripted expert (or on `demonstrations`), of a fresh tiny model or of `init_model`
    (docs/small-profile.md, docs/own-task.md). The shipped checkpoint's COMMAND overrides only
    give_up_rate."""

    seed: Int = opt(0, "seed of the model init, the training worlds and the data order")
    hidden: Int = opt(128, "model width (0.5-2M parameters train fastest per minute on 2 cores)", ge=32)
    layers: Int = opt(4, "transformer layers", ge=1)
    heads: Int = opt(4, "attention heads", ge=1)
    kv_heads: Int = opt(2, "key/value heads", ge=1)
    intermediate: Int = opt(384, "MLP width", ge=8)
    context: Int = opt(2048, "max tokens per node (model positions, runtime budget, SFT max length)", ge=256)
    init_model: str = opt(
        "",
        "fine-tune this checkpoint (a shipped name, a local folder or a hub id, downloaded on first "
        "use) instead of a fresh model; the model settings above and the copy drill are then unused",
    )
    demonstrations: str = opt(
        "",
        "a Parquet file or folder of trees in the nodes schema (e.g. <run>/rollouts/round=0 of a "
        "scripted or stronger policy) to learn from instead of the suite's expert; its token ids must "
        "be the model's tokenizer's",
    )
    demonstrator: str = opt(
        "",
        "dataset suite: module:function(task: dict) -> the cells a node writes (text); its trees, run "
        "in the sandbox with the run's tokenizer, are the warm start's data (docs/own-task.md, Route A)",
    )
    recursive_episodes: Int = opt(2500, "expert trees in the recursive shape (several nodes each)", ge=0)
    flat_episodes: Int = opt(4000, "expert trees in the flat shape (one node each)", ge=0)
    recursive_tiers: Annotated[list[Annotated[Int, Field(ge=1, le=6)]], NumberList] = opt(
        [2, 3, 3, 4], "textcraft-small: target tiers of recursive trees, sampled uniformly", min_length=1
    )
    flat_tiers: Annotated[list[Annotated[Int, Field(ge=1, le=6)]], NumberList] = opt(
        [1, 2, 2, 2, 3], "textcraft-small: target tiers of flat trees, sampled uniformly", min_length=1
    )
    error_rate: Float = opt(
        0.04, "expert slips per turn (each followed by its repair; slips get no loss)", ge=0, le=1
    )
    give_up_rate: Float = opt(
        0.0,
        "share of expert sub-agents that fail (quit at once or loop), so parents show recovery",
        ge=0,
        le=1,
    )
    root_inline_rate: Float = opt(
        0.0,
        "share of the expert's recursive trees whose root walks the task inline instead of delegating "
        "(> 0: a warm start that rarely delegates at the root, for RL to teach it; docs/main-job.md)",
        ge=0,
        le=1,
    )
    max_minutes: Float = opt(10.0, "wall-clock budget of training, drill included", gt=0)
    max_steps: Int = opt(-1, "optimizer steps (-1: until max_minutes or epochs run out)", ge=-1)
    epochs: Float = opt(4.0, "passes over the data at most", gt=0)
    batch_size: Int = opt(8, "sequences per optimizer step (small: many steps per minute)", ge=1)
    lr: Float = opt(2e-3, "peak learning rate (AdamW)", gt=0, lt=1)
    warmup: Float = opt(0.03, "fraction of the budget spent warming the learning rate up", ge=0, lt=1)
    decay: Float = opt(0.2, "final fraction of the budget over which the lr decays linearly", ge=0, le=1)
    min_lr_ratio: Float = opt(0.1, "the decay ends at lr * min_lr_ratio", ge=0, le=1)
    drill_steps: Int = opt(
        1500, "stage 0, copy drill: at most this many steps of batch 16 (0: no drill)", ge=0
    )
    drill_stop_loss: Float = opt(0.05, "stage 0 ends once its loss is below this", ge=0)
    drill_mix: Float = opt(
        0.1, "drill rows mixed into the SFT data (fraction of it): copying stays supported", ge=0
    )
    weight_decay: Float = opt(0.0, "AdamW weight decay", ge=0)
    batches: Literal["length", "shuffled"] = opt(
        "length",
        "length: batches of examples of similar length (least padding: the tiny models' recipe); "
        "shuffled: examples in random order. Fine-tuning SmolLM2, batches by length held one node "
        "type each and it kept its majority action (craft) where the expert delegates: 9% held-out "
        "after 144 steps; shuffled, 90% of held-out nodes exactly right after 80 (docs/real-model.md)",
    )
    eval_tasks: Int = opt(100, "held-out tasks per difficulty and mode (0: skip evaluation)", ge=0)
    eval_difficulties: Labels = opt([], "difficulties to evaluate (the suite's labels; empty: all of them)")
    eval_seed: Int = opt(0, "seed of the held-out task sample")
    max_concurrent_trees: Int = opt(64, "trees in flight at once (expert data and evaluation)", ge=1)
    max_batch_size: Int = opt(64, "engine sequences per decode step", ge=1)
    bf16: StrictBool | None = opt(
        None,
        "bf16 autocast over float32 weights; null: when init_model is stored in bf16 and this CPU has "
        "bf16 matrix units (SmolLM2), never for a fresh tiny model. The result is saved in init_model's "
        "dtype with its float32 master beside it, which the first RL round trains on",
    )
    threads: Int = opt(
        1, "torch CPU threads: on a shared 2-core machine 2 threads oversubscribe (5x slower)", ge=1
    )

    @model_validator(mode="after")
    def _episodes(self) -> WarmStartConfig:
        if self.recursive_episodes + self.flat_episodes == 0:
            raise ValueError("warmstart.flat_episodes: 0: the warm start needs some expert episodes")
        if self.kv_heads > self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"warmstart.kv_heads: {self.kv_heads}: must divide warmstart.heads ({self.heads})"
            )
        return self
