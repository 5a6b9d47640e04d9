"""The training stage of one round: scored rollouts in, the next policy's Hugging Face checkpoint out.

`train_round` reads the round's trained nodes from the `samples` view, runs the RAO update with
TRL (trainer.py), and writes model + tokenizer + metrics.json to `out_path` atomically: the
checkpoint is built in a hidden temporary folder beside it and renamed into place, so an engine that
finds `out_path` finds a complete checkpoint. Idempotent: a finished `out_path` is returned as is.

Data-parallel on several processes (DDP, FSDP, ZeRO-3), launched as its own program:

    accelerate launch --config_file configs/accelerate/ddp.yaml -m rao_core.train.stage \
        --run-dir runs/default --round 3 --model runs/default/checkpoints/version=3 \
        --out runs/default/checkpoints/version=4 [--config run.yaml] [--set train.lr=1e-6 ...]

Every rank trains its share; only rank 0 writes the checkpoint, the others wait for it. The campaign
starts this itself (rao_core/train/launch.py) when `train.accelerate_config` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoConfig, AutoTokenizer, TrainerCallback

from rao_core import checkpoints, interrupts, runlock
from rao_core.checkpoints import is_complete
from rao_core.engines.probe import write_probe
from rao_core.layout import METRICS
from rao_core.models.loading import LOADING, load_causal_lm
from rao_core.models.locate import adapter_base, is_adapter
from rao_core.models.tokenizer import load_tokenizer
from rao_core.train import state
from rao_core.train.samples import read_rows
from rao_core.train.trainer import TrainConfig, lora_config, train_rows, world
from rao_core.train.trl_args import resolve_device, with_precision

log = logging.getLogger(__name__)


def saved_dtype(model_path: Path) -> torch.dtype:
    """The dtype the input checkpoint declares; the output is saved in it too (engines load it as is)."""
    dtype = getattr(AutoConfig.from_pretrained(model_path, local_files_only=True), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load_policy(model_path: Path, cfg: TrainConfig, tokenizer: str | Path | None = None) -> tuple[Any, Any]:
    """The model to train and the tokenizer, from checkpoint `model_path` and its trainer state.

    Full fine-tuning trains float32 master weights: the checkpoint's own master (state.py) when it
    has one, else the checkpoint upcast. With LoRA the frozen base stays in its dtype and the
    adapter (float32) trains on: the checkpoint's adapter, or a fresh one over version 0.
    """
    if cfg.lora:
        model = _lora_model(model_path, cfg)
    else:
        source = checkpoints.master_dir(model_path) or model_path
        model = load_causal_lm(source, dtype=torch.float32)
    if world()[1] == 1:  # launched: the trainer places each rank's copy (its own GPU, or its shards)
        model.to(resolve_device(cfg))
    if tokenizer is not None:  # policy.tokenizer: 'tiny', a shipped name, a folder or a hub id
        return model, load_tokenizer(str(tokenizer))
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    return model, tok


def load_reference(origin: Path | None) -> Any:
    """Version 0 in float32, frozen beside the policy: pi_ref of the KL term (train.beta > 0)."""
    if origin is None:
        raise ValueError("train.beta > 0 needs policy version 0 (origin) as the KL term's reference")
    source = checkpoints.master_dir(origin) or origin
    return load_causal_lm(source, dtype=torch.float32)


def _lora_model(model_path: Path, cfg: TrainConfig) -> Any:
    """Base + trainable adapter: the adapter checkpoint `model_path` trained on, or a fresh one
    (seeded) over the whole model `model_path` (version 0)."""
    from peft import PeftModel, get_peft_model

    base_path = adapter_base(model_path) if is_adapter(model_path) else model_path
    base = load_causal_lm(base_path, dtype=saved_dtype(base_path))
    if is_adapter(model_path):
        with LOADING:  # peft builds the adapter's layers the same way
            return PeftModel.from_pretrained(base, model_path, is_trainable=True)
    with LOADING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = get_peft_model(base, lora_config(cfg))
    model.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    return model


def train_round(
    run_dir: Path,
    round: int,
    model_path: Path,
    out_path: Path,
    cfg: TrainConfig,
    origin: Path | None = None,
    tokenizer: str | Path | None = None,
) -> dict[str, Any]:
    """Train policy version round+1 on round `round` of `run_dir`, starting from `model_path`.

    `origin`: version 0, against which `served_changed_total` is measured; `tokenizer`: a tokenizer
    to use and copy into the checkpoint instead of the input checkpoint's own (policy.tokenizer).
    Returns the metrics (also in `out_path/metrics.json`): loss, tokens, samples, grad_norm,
    seconds, tokens_per_s, mean_ratio, clipped_fraction, served_changed, update_rms_ratio, ...
    With no trainable row the input checkpoint is copied forward unchanged (the policy version
    still advances) and `skipped` says why.
    """
    run_dir, model_path, out_path = Path(run_dir), Path(model_path), Path(out_path)
    if is_complete(out_path):
        return json.loads((out_path / METRICS).read_text())
    rank, world_size = world()
    args = (run_dir, round, model_path, out_path, cfg, origin, tokenizer)
    if world_size > 1:
        _publish_on_rank0(*args, rank)
        return json.loads((out_path / METRICS).read_text())
    # train.device=cuda:N: GPU N is the current one while this process trains (accelerate, and so
    # TRL, place the model and its batches on the current GPU), so that the engines can have others
    gpu = torch.cuda.device(int(cfg.device.split(":")[1])) if cfg.device.startswith("cuda:") else None
    with gpu or contextlib.nullcontext():
        return _train_and_publish(*args)


def _publish_on_rank0(*args: Any) -> None:
    """Launched on several processes: every rank trains, rank 0 alone writes, the others wait for it.

    The process group is set up first so that the barrier also works when nothing is trained.
    """
    from accelerate import PartialState

    *train_args, rank = args
    state_ = PartialState(cpu=resolve_device(train_args[4]) == "cpu")
    try:
        _train_and_publish(*train_args, write=rank == 0)
    finally:
        state_.wait_for_everyone()


def _train_and_publish(
    run_dir: Path,
    round: int,
    model_path: Path,
    out_path: Path,
    cfg: TrainConfig,
    origin: Path | None = None,
    tokenizer: str | Path | None = None,
    write: bool = True,
) -> dict[str, Any]:
    """Train (every rank) and, when `write`, build the checkpoint in a temporary folder and publish it."""
    t0 = time.perf_counter()
    cfg = with_precision(cfg, model_path)  # train.bf16: null decided by the device and the checkpoint
    free = gpu_free()  # with vLLM asleep (policy.vllm_during_train), nearly the whole device
    rows = read_rows(run_dir, round)
    stale = trains_stale_trees(run_dir, round)
    cfg = cfg.for_round(stale)  # no corrections in a round of fresh trees (k = 0); `auto` settled
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for debris in out_path.parent.glob(f".tmp-{out_path.name}-*"):  # a killed attempt's half checkpoint
        shutil.rmtree(debris, ignore_errors=True)
    tmp = out_path.parent / f".tmp-{out_path.name}-{uuid.uuid4().hex[:8]}"
    head = {
        "round": round,
        "policy_version": round + 1,
        "stale_trees": stale,  # trained on a tree an older version sampled (campaign.max_staleness)
        "model_path": str(model_path),
        "config": dataclasses.asdict(cfg),
    }
    try:
        if not any(r.action_tokens for r in rows):
            reason = "no trained rows" if not rows else "no trainable action tokens"
            metrics = {**head, "samples": len(rows), "steps": 0, "tokens": 0, "skipped": reason}
            if not write:
                return metrics
            shutil.copytree(model_path, tmp, ignore=shutil.ignore_patterns(METRICS))  # its state too
        else:
            model, tok = load_policy(model_path, cfg, tokenizer)
            opt_file = checkpoints.optimizer_file(model_path) if cfg.keep_optimizer_state else None
            moments = torch.load(opt_file, map_location="cpu", weights_only=True) if opt_file else None
            before = state.snapshot(model) if cfg.lora else None
            reference = load_reference(origin) if cfg.beta and not cfg.lora else None
            with tempfile.TemporaryDirectory(prefix="rao-train-") as work:
                model, metrics = train_rows(
                    model, tok, rows, cfg, Path(work), [NoteSteps(run_dir)], moments, reference,
                    earlier_kls(out_path, round, cfg.corrections == "stale_rounds") if cfg.kl_guard != "off" else None,
                )  # fmt: skip
            del reference
            optimizer_state = metrics.pop("optimizer_state", None)
            metrics = {**head, **metrics, **free, "resumed_optimizer": moments is not None}
            if not write:
                return metrics
            assert model is not None  # rank 0 always gets the whole model back
            _write_checkpoint(model, tok, model_path, origin, tmp, cfg, metrics, optimizer_state, before)
        metrics["stage_seconds"] = time.perf_counter() - t0
        metrics["peak_rss_mib"] = peak_rss_mib()
        runlock.note_progress(run_dir, "publishing the checkpoint", every_s=0)
        metrics = checkpoints.publish(tmp, out_path, metrics)
        if model_path.parent == out_path.parent:  # the run's own checkpoints: only the latest keeps
            checkpoints.drop_state(model_path)  # the trainer state (a 4B model's master and moments: 48 GB)
        log.info("rank %d wrote checkpoint %s", world()[0], out_path)
        return metrics
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def trains_stale_trees(run_dir: Path, round: int) -> bool:
    """Whether round `round` trains on a node sampled by an older version than the one it trains."""
    from rao_core.scoring import scores_summary

    ages = scores_summary(run_dir, round)["staleness"]
    return any(age > 0 and n["trained_nodes"] for age, n in ages.items())


def earlier_kls(out_path: Path, round: int, stale_only: bool) -> list[float]:
    """The sampler mismatch KLs of the rounds before `round`, from the run's checkpoints beside
    `out_path` (version v's metrics.json holds round v-1's): what train.kl_guard judges a jump by.
    `stale_only`: of the rounds that trained on stale trees (a fresh round's KL is only the
    numerical mismatch, far below a stale round's)."""
    kls = []
    for v in range(1, round + 1):
        path = out_path.parent / f"version={v}" / METRICS
        m = json.loads(path.read_text()) if path.is_file() else {}
        if "mismatch_kl" in m and (m.get("stale_trees") or not stale_only):
            kls.append(float(m["mismatch_kl"]))
    return kls


class NoteSteps(TrainerCallback):
    """How far the train stage is ("step 3 of 8"), for `rao status` and an interrupted command's
    line; a no-op in a launched rank (it holds no run folder's lock)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        runlock.note_progress(self.run_dir, f"step {state.global_step} of {state.max_steps}")
        interrupts.check()  # a signal whose exception a finalizer dropped ends the training here


def _write_checkpoint(
    model: Any, tok: Any, model_path: Path, origin: Path | None, tmp: Path, cfg: TrainConfig,
    metrics: dict[str, Any], optimizer_state: dict | None, adapter_before: dict | None,
) -> None:  # fmt: skip
    """Into `tmp`: the served copy (or the adapter), the tokenizer, the probe, the trainer state;
    into `metrics`: how far the round moved the weights, and a warning line when it matters."""
    if cfg.lora:
        metrics.update(state.adapter_change(adapter_before, model), served_dtype="float32 (adapter)")
        model.save_pretrained(tmp)  # the adapter alone (peft's folder), naming its base by absolute path
    else:
        metrics.update(_save_full(model, model_path, origin, tmp))
    tok.save_pretrained(tmp)
    cast_parameters(model, torch.float32)  # the served values, computed in float32
    write_probe(model.eval(), tok, tmp)  # how an engine proves it serves these weights
    if optimizer_state is not None:
        (tmp / checkpoints.STATE).mkdir(exist_ok=True)
        torch.save(optimizer_state, tmp / checkpoints.STATE / checkpoints.OPTIMIZER)
    del model  # the flow process lives on: hand the GPU memory back before the next stage
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    warnings = [state.no_change_warning(metrics, metrics["served_dtype"])]
    if not cfg.lora and origin is not None and Path(origin).resolve() != model_path.resolve():
        warnings.append(state.lost_master_warning(model_path, metrics["served_dtype"]))
    if warning := "; ".join(w for w in warnings if w):
        log.warning(warning)
        metrics["warning"] = warning


def _save_full(model: Any, model_path: Path, origin: Path | None, tmp: Path) -> dict[str, Any]:
    """The served copy in the input's dtype, the float32 master beside it when that dtype is
    narrower, and how far the round moved both (state.full_change). Leaves `model`'s parameters
    in the served dtype (the caller upcasts them again for the probe)."""
    dtype = saved_dtype(model_path)
    if dtype != torch.float32:
        model.save_pretrained(tmp / checkpoints.STATE / checkpoints.MASTER)
    change = state.full_change(
        model.state_dict(), model_path, checkpoints.master_dir(model_path), origin, dtype
    )
    cast_parameters(model, dtype)
    model.save_pretrained(tmp)
    return {**change, "served_dtype": str(dtype).removeprefix("torch.")}


def cast_parameters(model: Any, dtype: torch.dtype) -> None:
    """Parameters only, in place. `model.to(dtype)` would also round the float32 buffers (RoPE's
    inv_freq): a bf16 round trip of those moved a 0.6B model's probe log-probs by 0.1, while an
    engine loading the checkpoint computes them afresh in float32."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def gpu_free() -> dict[str, float]:
    """Free and total memory of this process's GPU, in GiB (nothing on a CPU)."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"gpu_free_gib_at_start": free / 2**30, "gpu_total_gib": total / 2**30}


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    """Entry point of one launched training stage; rank 0 prints the round's metrics as JSON."""
    from rao_core.config import build, parse_override
    from rao_core.config.loading import merge_layers

    p = argparse.ArgumentParser(prog="python -m rao_core.train.stage", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", required=True, type=Path, help="the run folder (rollouts and scores)")
    p.add_argument("--round", required=True, type=int, help="the scored round to train on")
    p.add_argument("--model", required=True, type=Path, help="checkpoint of policy version `round`")
    p.add_argument("--out", required=True, type=Path, help="where policy version round+1 is written")
    p.add_argument(
        "--origin", type=Path, help="policy version 0 (served_changed_total is measured against it)"
    )
    p.add_argument("--tokenizer", help="tokenizer to use instead of the checkpoint's own (policy.tokenizer)")
    p.add_argument("--config", type=Path, help="run YAML; only its `train` section is used")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.lr=1e-6"
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    layers = [yaml.safe_load(a.config.read_text()) or {}] if a.config else []
    layers += [parse_override(text) for text in a.set]
    cfg = build({"train": merge_layers(layers).get("train", {})}).train  # the only section it reads
    metrics = train_round(a.run_dir, a.round, a.model, a.out, cfg, a.origin, a.tokenizer)
    if world()[0] == 0:
        print(json.dumps({k: v for k, v in metrics.items() if k != "config"}, default=str))


if __name__ == "__main__":
    main()
