"""A run folder: every path, marker and "complete" check in one place, with one naming scheme.

    runs/<run>/
      config.yaml  config_history.jsonl  tracking.json  RUN.lock
      data/<suite>/                       tasks (and worlds, corpora) of the suite
      rollouts/round=r/[shard=k/]         node rows of round r, sampled by policy version r
      scores/round=r/                     rewards, baselines, advantages of round r
      checkpoints/warmstart/model/        a warm start trained in this run (policy.model=warmstart)
      checkpoints/version=v/              policy version v (metrics.json written last: complete)
      eval/version=v/                     held-out trees of version v, summary.json
      compare/version=v/mode=m/ctx=c/     `rao eval --compare` cells
      viewer/round=r/                     tree pages of round r
      logged/round=r.json  logged/baseline.json   what is in MLflow already
      reports/  logs/  judge_cache/

Partitions written by rollouts and evaluation are complete once their `_COMPLETE` marker exists
(rao_core/store/parquet.py); a checkpoint once its metrics.json does. Names are `key=value`
throughout: a round is the data of one round, a version is one policy. Folders of runs made
before this scheme (`checkpoints/round-v`, `eval/round=v`, `logged/round-r.json`) are renamed when
the layout is opened (`migrate`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MARKER = "_COMPLETE"
METRICS = "metrics.json"  # a checkpoint's marker, written last


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @classmethod
    def open(cls, root: str | Path) -> RunLayout:
        """The layout of the run folder `root`, old names migrated."""
        layout = cls(Path(root))
        layout.migrate()
        return layout

    # -- files of the run ------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def history(self) -> Path:
        return self.root / "config_history.jsonl"

    @property
    def tracking(self) -> Path:
        return self.root / "tracking.json"

    @property
    def lock(self) -> Path:
        return self.root / "RUN.lock"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def judge_cache(self) -> Path:
        return self.root / "judge_cache"

    def data(self, suite: str) -> Path:
        """The suite's synthesized data; a suite named by import path gets a plain folder name."""
        return self.root / "data" / suite.replace(":", "-").replace("/", "-")

    # -- stage outputs ---------------------------------------------------------------------
    def rollouts(self, round_: int) -> Path:
        return self.root / "rollouts" / f"round={round_}"

    def scores(self, round_: int) -> Path:
        return self.root / "scores" / f"round={round_}"

    def checkpoint(self, version: int) -> Path:
        return self.root / "checkpoints" / f"version={version}"

    @property
    def warmstart(self) -> Path:
        """The warm-start stage's work folder; its checkpoint is the `model` folder inside."""
        return self.root / "checkpoints" / "warmstart"

    def eval(self, version: int) -> Path:
        return self.root / "eval" / f"version={version}"

    def compare(self, version: int, mode: str, ctx: int) -> Path:
        return self.root / "compare" / f"version={version}" / f"mode={mode}" / f"ctx={ctx}"

    def sampled_eval(self, cell: str, version: int) -> Path:
        """scripts/sampled_eval.py: version v evaluated with other sampling settings (`cell`)."""
        return self.root / "eval-sampled" / cell / f"version={version}"

    def viewer(self, round_: int) -> Path:
        return self.root / "viewer" / f"round={round_}"

    def logged(self, round_: int) -> Path:
        return self.root / "logged" / f"round={round_}.json"

    @property
    def logged_baseline(self) -> Path:
        return self.root / "logged" / "baseline.json"

    # -- where the run stands --------------------------------------------------------------
    @staticmethod
    def complete(partition: Path) -> bool:
        """A Parquet partition (rollouts, scores, eval, compare) is whole once its marker exists."""
        return (partition / MARKER).is_file()

    def checkpoint_complete(self, version: int) -> bool:
        return (self.checkpoint(version) / METRICS).is_file()

    def warmstart_complete(self) -> bool:
        """The warm start's metrics.json is written last, after its model folder."""
        return (self.warmstart / METRICS).is_file()

    def completed_rounds(self) -> int:
        """Rounds whose new policy has a complete evaluation (the next round to run)."""
        r = 0
        while self.complete(self.eval(r + 1)):
            r += 1
        return r

    def standing(self) -> str:
        """What the folder holds, in words: the completed rounds, and the stages of the next
        round already complete (what an interrupted command keeps)."""
        r = self.completed_rounds()
        done = [
            what
            for what, complete in (
                ("rollout", self.complete(self.rollouts(r))),
                ("scores", self.complete(self.scores(r))),
                (f"checkpoint v{r + 1}", self.checkpoint_complete(r + 1)),
            )
            if complete
        ]
        rounds = f"{r} complete round{'' if r == 1 else 's'}"
        return rounds + (f" and round {r}'s {', '.join(done)}" if done else "")

    def evaluated_versions(self) -> list[int]:
        """Every version with a complete evaluation, in order."""
        found = [int(p.name.split("=")[1]) for p in (self.root / "eval").glob("version=*")]
        return sorted(v for v in found if self.complete(self.eval(v)))

    def started(self) -> bool:
        """Whether any stage output of a round exists (settings then matter for resuming)."""
        parts = [*(self.root / "rollouts").glob("round=*"), *(self.root / "eval").glob("version=*")]
        return any(self.complete(p) for p in parts)

    # -- runs made before this layout ------------------------------------------------------
    def migrate(self) -> list[tuple[Path, Path]]:
        """Rename the folders of the old naming (`checkpoints/round-v`, `eval/round=v`,
        `logged/round-r.json`) to this one. Each rename is atomic; a run folder is migrated once."""
        moves = []
        old = [
            (self.root / "checkpoints", "round-", self.checkpoint),
            (self.root / "eval", "round=", self.eval),
        ]
        for folder, prefix, new in old:
            for path in folder.glob(f"{prefix}*") if folder.is_dir() else []:
                number = path.name.removeprefix(prefix)
                if number.isdigit() and not new(int(number)).exists():
                    moves.append((path, new(int(number))))
        logged = self.root / "logged"
        for path in logged.glob("round-*.json") if logged.is_dir() else []:
            number = path.stem.removeprefix("round-")
            if number.isdigit() and not self.logged(int(number)).exists():
                moves.append((path, self.logged(int(number))))
        for src, dest in moves:
            os.rename(src, dest)
        return moves
