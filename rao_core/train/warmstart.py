"""Warm start: supervised training of a policy on demonstration trees, then a closed-loop evaluation
on held-out tasks. Any suite, any tokenizer: the demonstrations are the suite's scripted expert run
through the real runtime, or a Parquet of trees in the nodes schema (warmstart.demonstrations); the
model is a fresh tiny one with our tokenizer, or a checkpoint of yours (warmstart.init_model) with
its own tokenizer and chat template. docs/small-profile.md (the tiny model), docs/own-task.md.

  demonstration trees (recursive and flat shapes; rao_core/train/demonstrations.py)
  -> one SFT example per successful node (its token ids; loss on its own action tokens only)
  -> stage 0 (fresh tiny model only): a copy drill (see copy_drill)
  -> TRL's SFTTrainer on a wall-clock budget -> checkpoint
  -> evaluation with the batching engine on the suite's held-out tasks

Why the trainer is subclassed: every node's transcript starts with the same system prompt, which is
most of its tokens (about 330 of 490 for a recursive node). Batches are grouped by shape (recursive
or flat) and length, the prompt prefix the batch shares is run once and its KV cache is expanded over
the batch, so each example costs only its own tokens. The loss is the same token-level CE.
"""

from __future__ import annotations

import json
import random
import shutil
import string
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from rao_core import checkpoints
from rao_core.agent.prompts import ChatFraming
from rao_core.agent.tree import TreeSpec
from rao_core.allocator import keep_freed_memory
from rao_core.checkpoints import initial_model
from rao_core.config import WarmStartConfig
from rao_core.envs.base import Suite
from rao_core.eval.metrics import wilson_interval
from rao_core.models.dtypes import declared_dtype
from rao_core.models.tiny import build_tiny_model, load_checkpoint, resolve_dtype, save_checkpoint
from rao_core.models.tokenizer import load_tokenizer, tiny_tokenizer
from rao_core.store.files import write_json, write_text
from rao_core.train.demonstrations import MODES, demonstration_examples, expert_examples, run_modes


# --- training -----------------------------------------------------------------------------------
class SharedPrefixCollator:
    """Pad a batch to the right after its longest common prefix, which is returned once."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        ids = [list(e["input_ids"]) for e in examples]
        labels = [list(e["labels"]) for e in examples]
        p = min(len(x) for x in ids)
        for x in ids[1:]:
            p = min(p, next((i for i, (a, b) in enumerate(zip(ids[0], x, strict=False)) if a != b), p))
        first_label = min(next(i for i, v in enumerate(lab) if v != -100) for lab in labels)
        # the token at p is predicted from the prefix's last logit, which is not computed: no label there
        p = max(0, min(p, first_label - 1))  # 0: nothing shared (drill rows next to node rows)
        width = max(len(x) for x in ids) - p
        pad = lambda xs, v: torch.tensor([x[p:] + [v] * (width - len(x) + p) for x in xs])  # noqa: E731
        mask = torch.tensor([[1] * (len(x) - p) + [0] * (width - len(x) + p) for x in ids])
        return {"prefix_ids": torch.tensor([ids[0][:p]]), "input_ids": pad(ids, self.pad_id),
                "labels": pad(labels, -100), "attention_mask": mask}  # fmt: skip


SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "logits_scaling")


class SharedPrefixSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss runs the batch's shared prefix once (see the module docstring)."""

    tokens_seen = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Token-level CE on the labelled (action) tokens. The LM head runs on those positions
        only: at a 49,152-token vocabulary the head over every position was most of a step."""
        if any(getattr(model.config.get_text_config(), k, None) for k in SCALED_LOGITS):
            raise NotImplementedError(
                f"warm start: a model whose logits are scaled ({', '.join(SCALED_LOGITS)})"
            )
        prefix, ids, labels = inputs["prefix_ids"], inputs["input_ids"], inputs["labels"]
        body = model.base_model  # called directly, so the autocast accelerate puts on forward is ours to add
        with self.accelerator.autocast():
            if prefix.shape[1] == 0:
                hidden = body(input_ids=ids, attention_mask=inputs["attention_mask"]).last_hidden_state
            else:
                cache = body(input_ids=prefix, use_cache=True).past_key_values
                cache.batch_repeat_interleave(ids.shape[0])
                ones = torch.ones(ids.shape[0], prefix.shape[1], dtype=ids.dtype, device=ids.device)
                mask = torch.cat([ones, inputs["attention_mask"]], dim=1)
                out = body(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
                hidden = out.last_hidden_state
            targets = labels[:, 1:]
            scored = targets != -100
            logits = model.get_output_embeddings()(hidden[:, :-1][scored])
        loss = F.cross_entropy(logits.float(), targets[scored])
        self.tokens_seen += int(inputs["attention_mask"].sum()) + prefix.shape[1]
        return (loss, logits) if return_outputs else loss


@dataclass
class _Phase:
    """One SFT run: its data, its budget (minutes and/or steps) and its schedule."""

    name: str
    rows: list[dict]
    batch_size: int
    minutes: float
    max_steps: int = -1
    decay: float = 0.2  # final fraction of the budget over which the lr decays (0: constant)
    stop_loss: float = 0.0  # stop early once the logged loss is below this


class _Budget(TrainerCallback):
    """Stops a phase at its budget (or target loss), drives the warmup-stable-decay schedule, logs.

    The schedule follows the wall clock, not the step count: on a shared CPU the steps a budget
    buys are unknown in advance. The lr stays at its peak until the last `decay` of the budget:
    copying names is learnt in a sudden phase change that an early decay can stall."""

    def __init__(self, cfg: WarmStartConfig, phase: _Phase, log_path: Path) -> None:
        self.cfg, self.phase, self.log_path, self.start = cfg, phase, log_path, time.monotonic()
        self.trainer: SharedPrefixSFTTrainer | None = None
        self.step_frac = 0.0

    def fraction(self) -> float:
        """Progress through the budget: the later of time and steps (when max_steps is set)."""
        return max(self.step_frac, (time.monotonic() - self.start) / (60 * self.phase.minutes))

    def lr_factor(self, _step: int) -> float:
        f, decay, r = self.fraction(), self.phase.decay, self.cfg.min_lr_ratio
        warm = min(1.0, f / self.cfg.warmup) if self.cfg.warmup > 0 else 1.0
        return warm * (1.0 if decay <= 0 or f < 1 - decay else r + (1 - r) * max(0.0, 1 - f) / decay)

    def on_train_begin(self, args, state, control, **kw):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kw):
        if self.phase.max_steps > 0:
            self.step_frac = state.global_step / self.phase.max_steps
        if time.monotonic() - self.start >= 60 * self.phase.minutes:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kw):
        seconds, logs = time.monotonic() - self.start, logs or {}
        tokens = self.trainer.tokens_seen if self.trainer else 0
        row = {"phase": self.phase.name, "step": state.global_step, "seconds": round(seconds, 1), "tokens": tokens,
               "tokens_per_s": round(tokens / max(seconds, 1e-9)), **logs}  # fmt: skip
        with self.log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if logs.get("loss", 1e9) < self.phase.stop_loss:
            control.should_training_stop = True


def train_sft(
    model, tokenizer, phase: _Phase, cfg: WarmStartConfig, work: Path, progress: bool, bf16: bool = False
) -> dict:
    """TRL's SFTTrainer on pre-tokenized rows (input_ids + assistant_masks -> labels), CPU, float32
    weights (bf16 autocast with `bf16`)."""
    budget = _Budget(cfg, phase, work / "train_log.jsonl")
    args = SFTConfig(
        output_dir=str(work / "trainer"), per_device_train_batch_size=phase.batch_size, num_train_epochs=cfg.epochs,
        max_steps=phase.max_steps, learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_length=cfg.context,
        logging_steps=10, save_strategy="no", report_to="none", use_cpu=True, bf16=bf16, fp16=False,
        train_sampling_strategy="group_by_length" if cfg.batches == "length" else "random",
        length_column_name="bucket", remove_unused_columns=False,
        dataloader_num_workers=0, seed=cfg.seed, data_seed=cfg.seed, disable_tqdm=not progress,
        gradient_accumulation_steps=1, packing=False, gradient_checkpointing=False, max_grad_norm=1.0,
    )  # fmt: skip
    opt_ = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt_, budget.lr_factor)
    data = Dataset.from_list(
        [{k: r[k] for k in ("input_ids", "assistant_masks", "bucket")} for r in phase.rows]
    )
    trainer = SharedPrefixSFTTrainer(
        model=model, args=args, train_dataset=data, processing_class=tokenizer,
        data_collator=SharedPrefixCollator(tokenizer.pad_token_id), optimizers=(opt_, sched), callbacks=[budget],
    )  # fmt: skip
    budget.trainer = trainer
    model.train()
    out = trainer.train()
    model.eval()
    seconds = time.monotonic() - budget.start
    logged = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in logged if x.get("phase") == phase.name and "loss" in x]
    return {"steps": out.global_step, "train_seconds": round(seconds, 1), "tokens_seen": trainer.tokens_seen,
            "tokens_per_s": round(trainer.tokens_seen / max(seconds, 1e-9)), "final_loss": losses[-1] if losses else None,
            "examples_seen": out.global_step * phase.batch_size}  # fmt: skip


def copy_drill(tokenizer, n: int, seed: int) -> list[dict]:
    """Stage 0: tiny episodes whose only lesson is to copy a name from the goal into a cell.

    Why: a tiny model learns to copy names (an induction circuit) in a sudden phase change. On the
    short drill it happens within a few hundred steps (about 30 s); on the long, name-heavy node
    transcripts alone it had not happened after 1,600 steps (10 min): every digit of every name was
    still a uniform guess. Learnt on the drill, copying carries over at once."""
    rng = random.Random(f"drill:{seed}")

    def name() -> str:
        return f"{rng.choice(string.ascii_lowercase)}{rng.randint(1, 99)}"

    rows = []
    for _ in range(n):
        a, b, c = name(), name(), name()
        prompt = tokenizer.encode(f"Goal: make {a}\nsee {b} {c}\n<python>\ninfo('", add_special_tokens=False)
        target = tokenizer.encode(f"{a}')", add_special_tokens=False)
        ids = prompt + target
        rows.append(
            {"input_ids": ids, "assistant_masks": [0] * len(prompt) + [1] * len(target), "bucket": len(ids)}
        )
    return rows


# --- evaluation ---------------------------------------------------------------------------------
def evaluate_small(
    model_path: str | Path,
    suite: Suite,
    n_per_difficulty: int = 100,
    difficulties: list[str] | tuple[str, ...] = (),
    modes: tuple[str, ...] = ("recursive", "flat"),
    seed: int = 0,
    context: int = 2048,
    max_batch_size: int = 64,
    max_concurrent_trees: int = 64,
    progress: bool = False,
    threads: int = 1,
) -> dict[str, Any]:
    """Greedy closed-loop success on the suite's held-out tasks (all its difficulties by default),
    by mode and difficulty, through the runtime and the batching engine (every cell really runs),
    on engine processes as a campaign's evaluation (policy.engine_processes: auto)."""
    from rao_core.config import HFPolicy
    from rao_core.engines.open import open_policy_engine
    from rao_core.engines.scope import engine_scope

    torch.set_num_threads(threads)
    difficulties = tuple(difficulties) or suite.labels(suite.args)[1]
    policy = HFPolicy(model=str(model_path), device="cpu", dtype="auto", max_batch_size=max_batch_size)
    tasks = suite.held_out_tasks(difficulties, n_per_difficulty, seed)
    jobs = [(m, TreeSpec(t.task_id, 0, suite.env(t), t.difficulty)) for m in modes for t in tasks]
    start, done = time.time(), [0]

    def tick() -> None:
        done[0] += 1
        if progress and (done[0] % 50 == 0 or done[0] == len(jobs)):
            print(f"eval: {done[0]}/{len(jobs)} trees, {time.time() - start:.0f} s", flush=True)

    with engine_scope():  # children of its own, stopped after (not kept idle in a campaign's scope)
        engine, tokenizer = open_policy_engine(policy, Path(model_path))
        chat = ChatFraming(tokenizer, suite.ctx.policy.chat_template_kwargs)
        runs = run_modes(jobs, suite, engine, chat, context, max_concurrent_trees, 0.0, lambda _: tick())
    wins: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for mode, run in runs:
        root = next(r for r in run.records if r.parent_id is None)
        wins[mode][run.spec.difficulty].append(root.success)
        for r in run.records:
            statuses[mode][r.status] += 1
    table = {m: {d: _rate(wins[m][d]) for d in difficulties} for m in modes}
    return {"success": table, "statuses": {m: dict(s) for m, s in statuses.items()},
            "trees": len(jobs), "seconds": round(time.time() - start, 1), "seed": seed}  # fmt: skip


def _rate(xs: list[float]) -> dict[str, float]:
    lo, hi = wilson_interval(sum(xs), len(xs))
    return {"rate": sum(xs) / max(1, len(xs)), "n": len(xs), "lo": round(lo, 3), "hi": round(hi, 3)}


# --- the stage ----------------------------------------------------------------------------------
def warm_start(
    cfg: WarmStartConfig, out_dir: str | Path, suite: Suite, progress: bool = False
) -> dict[str, Any]:
    """Data -> SFT -> out_dir/model (atomic) -> evaluation -> out_dir/metrics.json (written last).

    Idempotent: a complete out_dir (metrics.json present) is returned as is; expert data is reused."""
    out = Path(out_dir)
    if (out / "metrics.json").is_file() and (out / "model" / "config.json").is_file():
        return json.loads((out / "metrics.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_log.jsonl").unlink(missing_ok=True)
    torch.set_num_threads(cfg.threads)
    keep_freed_memory()  # allocator.py
    init = initial_model(cfg.init_model, out) if cfg.init_model else None
    tok = load_tokenizer(str(init)) if init else tiny_tokenizer()
    t0 = time.time()
    data_path, trees_path = out / "sft.jsonl", out / "trees.json"
    if data_path.is_file():
        rows = [json.loads(line) for line in data_path.read_text().splitlines()]
    else:
        if cfg.demonstrations:  # no trees of ours: only the examples are counted
            rows = demonstration_examples(cfg, len(tok))
            trees = {"examples": len(rows)}
        else:
            chat = ChatFraming(tok, suite.ctx.policy.chat_template_kwargs)
            rows, trees = expert_examples(cfg, chat, suite)
        write_json(trees_path, trees)
        write_text(data_path, "".join(json.dumps(r) + "\n" for r in rows))
    trees = json.loads(trees_path.read_text()) if trees_path.is_file() else {}
    data = {"examples": len(rows), "trees": trees, "data_seconds": round(time.time() - t0, 1),
            "by_mode": {m: sum(r["mode"] == m for r in rows) for m in MODES},
            "tokens": sum(len(r["input_ids"]) for r in rows),
            "action_tokens": sum(sum(r["assistant_masks"]) for r in rows)}  # fmt: skip
    if progress:
        print(f"expert data: {json.dumps(data)}", flush=True)
    torch.manual_seed(cfg.seed)
    if init is not None:  # fine-tune a trained checkpoint: it can already copy, so no drill
        model, _ = load_checkpoint(init, device="cpu", dtype=torch.float32)
    else:
        model = build_tiny_model(tok, seed=cfg.seed, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                                 kv_heads=cfg.kv_heads, intermediate=cfg.intermediate, max_positions=cfg.context)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    stored = getattr(torch, declared_dtype(init)) if init is not None else torch.float32  # saved as
    bf16 = cfg.bf16 if cfg.bf16 is not None else resolve_dtype("auto", "cpu", init) == torch.bfloat16
    t1, train = time.monotonic(), {}
    if cfg.drill_steps > 0 and not cfg.init_model:
        drill = _Phase("drill", copy_drill(tok, 16 * cfg.drill_steps, cfg.seed), 16, cfg.max_minutes / 2,
                       cfg.drill_steps, decay=0.0, stop_loss=cfg.drill_stop_loss)  # fmt: skip
        train["drill"] = train_sft(model, tok, drill, cfg, out, progress)
    minutes = cfg.max_minutes - (time.monotonic() - t1) / 60
    mix = copy_drill(tok, int(cfg.drill_mix * len(rows)), cfg.seed + 1) if "drill" in train else []
    main = _Phase("sft", rows + mix, cfg.batch_size, minutes, cfg.max_steps, decay=cfg.decay)
    train.update(train_sft(model, tok, main, cfg, out, progress, bf16))
    save_model(model, tok, out / "model", stored)
    shutil.rmtree(out / "trainer", ignore_errors=True)
    metrics: dict[str, Any] = {"config": asdict(cfg), "parameters": params, "data": data, "train": train}
    if cfg.eval_tasks > 0:
        metrics = evaluate_warm_start(cfg, out, suite, progress, metrics)
    else:
        write_json(out / "metrics.json", metrics)
    if not progress:  # `rao warmstart` (progress) prints it last, under its tables
        print(summary_line(cfg, metrics), flush=True)
    return metrics


def save_model(model, tok, path: Path, dtype: torch.dtype) -> None:
    """The trained model in `dtype` (the init model's), atomically; when that is narrower than
    float32, its float32 master weights beside it (checkpoints.py's layout), from which the first
    RL round trains: a bf16 copy alone would round away updates smaller than bf16's resolution."""
    if dtype == torch.float32:
        save_checkpoint(model, tok, path)
        return
    tmp = path.parent / f".{path.name}.tmp-{time.time_ns()}"
    model.save_pretrained(tmp / checkpoints.STATE / checkpoints.MASTER)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    for p in model.parameters():
        p.data = p.data.to(torch.float32)
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def summary_line(cfg: WarmStartConfig, metrics: dict[str, Any]) -> str:
    """The warm start in one line: its data, its training and its held-out success."""
    data, train, trees = metrics["data"], metrics["train"], metrics["data"].get("trees", {})
    made = (
        f"{trees['made']} demonstration trees, {trees['kept']} kept ({data['examples']} nodes to learn from), "
        f"{trees['dropped']} dropped (roots that ended: {trees['dropped_by']})"
        if "made" in trees
        else f"{data['examples']} demonstration nodes from {cfg.demonstrations}"
    )
    loss = f", final loss {train['final_loss']:.3f}" if train.get("final_loss") is not None else ""
    ev = metrics.get("eval")
    if ev is None:
        held = (
            "held-out success not measured here (warmstart.eval_tasks=0: the campaign's v0 evaluation is it)"
        )
    else:
        cells = {m: [c for c in by.values()] for m, by in ev["success"].items()}
        rate = {
            m: sum(c["rate"] * c["n"] for c in cs) / max(1, sum(c["n"] for c in cs))
            for m, cs in cells.items()
        }
        held = "held-out success " + ", ".join(
            f"{m} {r:.0%} (n={sum(c['n'] for c in cells[m])})" for m, r in rate.items()
        )
    return (
        f"warm start: {made}; {train['steps']} steps in {train['train_seconds'] / 60:.1f} min{loss}; {held}"
    )


def evaluate_warm_start(
    cfg: WarmStartConfig,
    out: Path,
    suite: Suite,
    progress: bool = False,
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Held-out evaluation of `<out>/model` as metrics.json's "eval", written last (also run on its
    own, `scripts/warmstart.py --eval_only`, for a checkpoint trained with `eval_tasks=0`)."""
    metrics = metrics if metrics is not None else json.loads((out / "metrics.json").read_text())
    metrics["eval"] = evaluate_small(
        out / "model", suite, cfg.eval_tasks, cfg.eval_difficulties, seed=cfg.eval_seed, context=cfg.context,
        max_batch_size=cfg.max_batch_size, max_concurrent_trees=cfg.max_concurrent_trees, progress=progress,
        threads=cfg.threads,
    )  # fmt: skip
    write_json(out / "metrics.json", metrics)
    return metrics
