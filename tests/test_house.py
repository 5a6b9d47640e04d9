"""The plan of the house (docs/house.md), checked: modules sit on floors and import only their
own floor and the floors below; the stages sit side by side and none imports another; few
functions take the whole run configuration; the configuration, followed from the rollout stage,
reaches few rooms."""

from __future__ import annotations

import ast

from tests.test_structure import MODULES, graph

# Bottom first. A module may import its own floor and the floors below, never a floor above.
FLOORS = [
    ["rao_core", "rao_core.config", "rao_core.layout", "rao_core.errors", "rao_core.status", "rao_core.versions",
     "rao_core.store", "rao_core.sql"],
    ["rao_core.policy", "rao_core.verdicts", "rao_core.envs.base"],
    ["rao_core.agent", "rao_core.models", "rao_core.engines"],
    ["rao_core.envs", "rao_core.judges"],
    ["rao_core.sampler", "rao_core.scoring", "rao_core.train", "rao_core.eval", "rao_core.tracking",
     "rao_core.query", "rao_core.memory", "rao_core.resume", "rao_core.runlock", "rao_core.doctor",
     "rao_core.checkpoints", "rao_core.envs.checks"],
    ["rao_core.run"],
    ["rao_core.stages"],
    ["rao_core.campaign"],
]  # fmt: skip
STAGES = ["synthesize", "warm_start", "rollout", "score", "train", "evaluate", "report"]
# Functions that take the whole RunConfig (14; 84 before the stages): what sees every section by
# its nature. `--check` (check_run: 1), resume and branches (4), saving it (2), the doctor (1),
# building the narrow views (SuiteContext.of, Tracker.of, make_suite, open_suite: 4), the control
# arm (1), `rao warmstart` (1). The work below the stages (sampler, engines, agent, scoring,
# trainer, suites, Suite.check) never does. A ratchet: it may only go down (docs/house.md).
MAX_WHOLE_CONFIG = 14
MAX_ROOMS = 8


def floor(module: str) -> int:
    """The floor of the longest prefix of `module` named in FLOORS."""
    best = max((p for f in FLOORS for p in f if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, f in enumerate(FLOORS) if best in f)


def test_every_module_has_a_floor_and_no_import_climbs():
    up = [(m, d) for m, deps in graph().items() for d in deps if floor(d) > floor(m)]
    assert up == []


def test_the_stages_sit_side_by_side():
    modules = {f"rao_core.stages.{s}" for s in STAGES}
    assert modules <= set(MODULES)
    for m in modules:
        assert graph()[m] & modules == set(), f"{m} imports another stage"


def takes_whole_config(path) -> list[str]:
    """Functions with a parameter annotated RunConfig (or a list of them)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(p.annotation is not None and "RunConfig" in ast.unparse(p.annotation) for p in params):
                out.append(node.name)
    return out


def test_few_functions_take_the_whole_configuration():
    found = [f"{m}.{f}" for m, p in MODULES.items() for f in takes_whole_config(p)]
    assert len(found) <= MAX_WHOLE_CONFIG, found


def test_the_configuration_from_the_rollout_stage_reaches_few_rooms():
    """Rooms: modules reached from the rollout stage through imports of modules that take the whole
    run (Run) or its configuration (RunConfig). The import graph has no cycle, so no walk returns."""
    whole = {m for m, p in MODULES.items() if takes_whole_config(p) or "Run" in _run_params(p)}
    edges, start = graph(), "rao_core.stages.rollout"
    rooms, todo = {start}, [start]
    while todo:
        for d in edges[todo.pop()] & whole - rooms:
            rooms.add(d)
            todo.append(d)
    assert len(rooms) <= MAX_ROOMS, sorted(rooms)


def _run_params(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for p in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                if p.annotation is not None and ast.unparse(p.annotation) in ("Run", "list[Run]"):
                    names.add("Run")
    return names


def test_a_configuration_is_parsed_once_per_process(tmp_path):
    """`rao train` checks the configuration, then its flow runs it: one parse, one Run."""
    import os

    from rao_core.run import Run

    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  num_tasks: 3\n")
    first = Run.load(path, [f"runs_dir={tmp_path}"])
    assert Run.load(path, [f"runs_dir={tmp_path}"]) is first
    assert Run.load(path, [f"runs_dir={tmp_path}", "rollout.group_size=3"]) is not first
    path.write_text("rollout:\n  num_tasks: 5\n")  # edited on disk: read again
    os.utime(path, ns=(1, 1))
    assert Run.load(path, [f"runs_dir={tmp_path}"]).config.rollout.num_tasks == 5


def test_the_round_is_an_argument_and_old_run_configs_still_load(tmp_path):
    import pytest

    from rao_core.config import ConfigError
    from rao_core.run import load_config

    old = tmp_path / "config.yaml"  # a run folder's config.yaml of before: the round was a setting
    old.write_text("rollout:\n  round: 2\n  policy_version: 2\n  num_tasks: 3\n")
    assert load_config(old).rollout.num_tasks == 3
    with pytest.raises(ConfigError, match=r"rollout.round: removed: .*--round"):
        load_config(overrides=["rollout.round=3"])


def test_every_import_of_the_library_in_scripts_and_benches_resolves():
    """Scripts and benches run by hand, not by the tests: a module moved in the house must not
    leave one importing its old home (scripts/plot_runs.py did once)."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [*root.glob("scripts/*.py"), *root.glob("bench/*.py"), *root.glob("examples/**/*.py")]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("rao_core")
            ):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ModuleNotFoundError:
                            missing.append(f"{path.relative_to(root)}: {node.module}.{alias.name}")
    assert missing == []


DATA = __import__("pathlib").Path(__file__).parent / "data"


def test_the_built_in_suites_settings_are_their_args():
    """A built-in suite's settings are its `Args`, as a plugin suite's are: suite_args.*, checked
    by the suite, with every default in the saved configuration; none is a RunConfig section."""
    import pytest

    from rao_core.config import ConfigError, RunConfig
    from rao_core.envs.registry import suite_class
    from rao_core.run import load_config

    assert {"world", "oolong", "deepdive"}.isdisjoint(RunConfig.__pydantic_fields__)
    assert list(RunConfig().tasks.__pydantic_fields__) == ["seed"]  # the run's, not a suite's
    for suite in ("textcraft", "textcraft-small", "oolong", "deepdive"):
        cls = suite_class(suite)
        assert cls.Args is not None
        assert load_config(overrides=[f"suite={suite}"]).suite_args == cls.Args().model_dump(mode="json")
    assert load_config(overrides=["suite=textcraft", "suite_args.world_seed=7"]).suite_args["world_seed"] == 7
    with pytest.raises(ConfigError, match=r"^suite_args.world_seed: not a setting of TextCraftSmallData"):
        load_config(overrides=["suite_args.world_seed=7"])


def test_old_configurations_of_the_built_in_suites_still_load(tmp_path):
    """config.yaml files saved before the move (tests/data, written by a40fa56's save_config): the
    run's suite's settings move into suite_args, the other suites' are dropped, tasks.seed stays."""
    import pytest
    import yaml

    from flows.cli import _warning_line
    from rao_core.config import ConfigError, ConfigWarning
    from rao_core.envs.args import moved_hint
    from rao_core.run import load_config

    old = load_config(DATA / "config-textcraft-a40fa56.yaml")
    assert old.suite == "textcraft" and old.tasks.seed == 3
    assert (old.suite_args["world_seed"], old.suite_args["tasks_per_item"]) == (7, 1)
    assert old.suite_args["distractors"] == [1, 3]
    small = load_config(DATA / "config-textcraft-small-a40fa56.yaml")
    assert small.suite_args == {"tasks_per_difficulty": 40}
    # a file's new key wins over its old one; a --set of an old key warns and moves
    both = tmp_path / "both.yaml"
    both.write_text(
        yaml.safe_dump(
            {"tasks": {"small_tasks_per_difficulty": 5}, "suite_args": {"tasks_per_difficulty": 6}}
        )
    )
    assert load_config(both).suite_args["tasks_per_difficulty"] == 6
    with pytest.warns(ConfigWarning, match=r"oolong.seed is now suite_args.seed"):
        assert load_config(overrides=["suite=oolong", "oolong.seed=3"]).suite_args["seed"] == 3
    with pytest.warns(FutureWarning):  # a built-in suite named by its import path is the same suite
        by_path = ["suite=rao_core.envs.suites:OolongData", "oolong.seed=4"]
        assert load_config(overrides=by_path).suite_args["seed"] == 4
    with pytest.raises(
        ConfigError,
        match=r"^oolong.seed: moved to suite_args.seed of suite oolong \(this run's suite is textcraft-small",
    ):
        load_config(overrides=["oolong.seed=3"])
    assert _warning_line("world.seed is now suite_args.world_seed", ConfigWarning, "x.py", 1) == (
        "warning: world.seed is now suite_args.world_seed\n"  # the `rao` command's one line
    )
    assert "moved into suite textcraft's settings" in moved_hint("world")
    assert "suite textcraft-small's" in moved_hint("tasks.small_tasks_per_difficulty")
    assert moved_hint("tasks.seed") is None and moved_hint("agent") is None
    with pytest.raises(
        ConfigError, match=r"^world.typo: unknown field \(suite textcraft's settings are suite_args"
    ):
        load_config(overrides=["suite=textcraft", "world.typo=3"])


def test_a_run_folder_of_before_the_move_resumes(tmp_path):
    """An old run folder's config.yaml is compared as today's: the same settings resume, a changed
    suite setting is refused by its new name."""
    import shutil

    import pytest

    from rao_core.config import ConfigError
    from rao_core.resume import check_resume
    from rao_core.run import load_config

    same = ["suite=textcraft", "suite_args.world_seed=7", "suite_args.tasks_per_item=1", "tasks.seed=3",
            "policy.kind=scripted", f"runs_dir={tmp_path}"]  # fmt: skip
    cfg = load_config(overrides=same)
    cfg.run_dir.mkdir(parents=True)
    shutil.copy(DATA / "config-textcraft-a40fa56.yaml", cfg.layout.config)
    (cfg.run_dir / "data").mkdir()  # a completed stage
    assert set(check_resume(cfg)) == {"runs_dir"}  # a free key; the suite's settings are the same
    with pytest.raises(ConfigError, match=r"suite_args.world_seed \(7 -> 8\)"):
        check_resume(load_config(overrides=[*same, "suite_args.world_seed=8"]))
