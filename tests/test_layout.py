"""The run folder's layout: one naming scheme, and run folders of the old one migrated in place."""

from __future__ import annotations

from rao_core import campaign
from rao_core.envs.suites import open_suite
from rao_core.layout import RunLayout
from rao_core.run import Run
from rao_core.stages.evaluate import evaluate
from rao_core.stages.rollout import roll_out
from rao_core.stages.score import score
from rao_core.stages.synthesize import prepare
from rao_core.stages.train import train


def test_every_stage_output_has_one_name(tmp_path):
    run = RunLayout(tmp_path / "r")
    names = [run.rollouts(2), run.scores(2), run.checkpoint(3), run.eval(3), run.viewer(2), run.logged(2)]
    assert [p.relative_to(run.root).as_posix() for p in names] == [
        "rollouts/round=2", "scores/round=2", "checkpoints/version=3", "eval/version=3",
        "viewer/round=2", "logged/round=2.json",
    ]  # fmt: skip
    assert (
        run.compare(3, "single", 1024).relative_to(run.root).as_posix()
        == "compare/version=3/mode=single/ctx=1024"
    )


def test_a_run_folder_of_the_old_naming_is_migrated_and_resumes(toy):
    """A finished round written with the old names (checkpoints/round-1, eval/round=v,
    logged/round-0.json) is renamed when the run is opened, and nothing is recomputed."""
    cfg = toy("run_name=old", "eval.num_tasks=1", "eval.difficulty=easy", "tracking.enabled=false")
    prepare(Run(cfg))
    open_suite(cfg)
    for stage in (lambda: evaluate(Run(cfg), 0), lambda: roll_out(Run(cfg), 0),
                  lambda: score(Run(cfg), 0), lambda: train(Run(cfg), 0),
                  lambda: evaluate(Run(cfg), 1)):  # fmt: skip
        stage()
    run = cfg.layout
    run.logged(0).parent.mkdir(parents=True)
    run.logged(0).write_text("{}")
    old = {
        run.checkpoint(1): run.root / "checkpoints" / "round-1",
        run.eval(0): run.root / "eval" / "round=0",
        run.eval(1): run.root / "eval" / "round=1",
        run.logged(0): run.root / "logged" / "round-0.json",
    }
    for new, former in old.items():
        new.rename(former)
    assert cfg.layout.completed_rounds() == 0  # the old names are not read as such

    stamp = {p: p.stat().st_mtime_ns for p in old.values()}
    moves = RunLayout(run.root).migrate()
    assert sorted(moves) == sorted((former, new) for new, former in old.items())
    assert RunLayout.open(run.root).migrate() == [] and prepare(Run(cfg)) == {}  # once is enough
    assert cfg.layout.completed_rounds() == 1 and campaign.status(Run(cfg))[0] == {
        "round": 0, "rollout": True, "score": True, "train": True, "eval": True, "logged": True,
    }  # fmt: skip
    assert {new: new.stat().st_mtime_ns for new in old} == {new: stamp[old[new]] for new in old}
    weights = run.checkpoint(1) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    train(Run(cfg), 0)  # complete: returned as it is
    evaluate(Run(cfg), 1)
    assert weights.stat().st_mtime_ns == before
