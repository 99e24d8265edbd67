"""The one registry kind (raycpt/registry.py, issue 46 item 5): names, one-line errors, a name registered once, and
the CLI help and the config reading it. Expected names are counted here from the source (ast) or spelled out."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from raycpt.errors import ConfigError, RaycptError
from raycpt.registry import BENCHMARKS, PLANS, READERS, SELECTORS, Registry
from raycpt.usage import Lazy, lazy

PACKAGE = Path(__file__).resolve().parents[2] / "raycpt"


def _functions_taking(path: Path, annotation: str) -> set[str]:
    """The module-level functions of ``path`` whose one parameter is annotated ``annotation`` (a score function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and len(f.args.args) == 1
            and isinstance(f.args.args[0].annotation, ast.Name) and f.args.args[0].annotation.id == annotation}


def _decorated_names(path: Path, decorator: str) -> list[str]:
    """The first argument of every ``@decorator("name", ...)`` in ``path``, in file order."""
    out = []
    for f in ast.parse(path.read_text(encoding="utf-8")).body:
        for d in getattr(f, "decorator_list", []):
            if isinstance(d, ast.Call) and ast.unparse(d.func) == decorator:
                out.append(d.args[0].value)
    return out


def test_method_help_names_exactly_the_selectors_the_module_implements():
    """selectors.py defines six functions of ``SelectorInputs`` (counted from its source); each is the target of one
    registered name, and ``--method``'s help (and the command's) lists exactly those names, no other."""
    from raycpt.cli import COMMANDS

    implemented = _functions_taking(PACKAGE / "diagnostics" / "selectors.py", "SelectorInputs")
    assert len(implemented) == 6
    targets = {}
    for name in SELECTORS.names():
        e = SELECTORS.entry(name)
        target = e.obj.name if isinstance(e.obj, Lazy) else e.obj.__name__
        targets[name] = target
    assert sorted(targets.values()) == sorted(implemented)  # one name per implemented function, none dangling
    row = COMMANDS["select"]
    method = next(o for o in row.options if o.name == "method")
    assert method.key == "select.method"
    listed = [w.strip() for w in re.sub(r"\([^()]*\)", "", method.help.replace("(sets select.method)", "")).split(",")]
    assert sorted(listed) == sorted(targets) and len(listed) == len(implemented)
    assert all(re.search(rf"\b{n}\b", row.help) for n in targets)


def test_every_plan_decorated_in_builders_is_registered_and_named_by_the_config_error():
    expected = _decorated_names(PACKAGE / "strategies" / "builders.py", "register_plan")
    assert len(expected) == 12 and PLANS.names() == tuple(expected)
    from raycpt.config import PlanConfig

    with pytest.raises(ConfigError) as e:
        PlanConfig(name="ful")
    assert str(e.value) == f"config error: plan.name='ful': one of {', '.join(expected)} (did you mean 'full'?)"
    assert "\n" not in str(e.value)


def test_an_unknown_name_is_one_line_naming_the_choices():
    r = Registry("widget")
    r.register("a", 1)
    r.register("b", 2, help="the second")
    with pytest.raises(RaycptError) as e:
        r.get("c")
    assert str(e.value) == "unknown widget 'c': use one of a, b"
    assert r.describe() == "a, b (the second)"
    with pytest.raises(RaycptError) as e:
        SELECTORS.get("adagrad")
    assert str(e.value) == "unknown selector 'adagrad': use one of bi, snr, layertracer, random, elo, gradnorm"
    from raycpt.strategies import build_plan
    from raycpt.config import PlanConfig

    cfg = PlanConfig()
    cfg.name = "nope"  # past the config's check: the plan builder says the same in one line
    with pytest.raises(RaycptError, match=r"^unknown plan 'nope': use one of full, train_shallow, "):
        build_plan(cfg, 4)


@pytest.mark.parametrize("registry", [PLANS, SELECTORS, READERS, BENCHMARKS], ids=lambda r: r.kind)
def test_a_name_registered_twice_is_refused_and_the_first_stays(registry):
    name = registry.names()[0]
    before = registry.entry(name)
    with pytest.raises(RaycptError, match=rf"^{registry.kind} {name!r} is registered twice"):
        registry.register(name, object(), help="a second one")
    with pytest.raises(RaycptError, match="registered twice"):
        registry.register(name)(lambda *a: None)  # the decorator form too
    assert registry.entry(name) is before


def test_the_decorator_returns_its_function_and_a_lazy_entry_imports_on_get():
    import json

    r = Registry("thing")

    @r.register("f", help="a function", cost=3)
    def f():
        return 7

    assert f() == 7 and r.get("f") is f and r.info("f", "cost") == 3 and r.info("f", "other", "x") == "x"
    r.register("dumps", lazy("json", "dumps"))
    assert isinstance(r.entry("dumps").obj, Lazy) and r.get("dumps") is json.dumps
    assert r.names() == ("f", "dumps") and list(r) == ["f", "dumps"] and len(r) == 2 and "f" in r


def test_every_shipped_benchmark_is_one_registered_yaml_ceval_and_cmmlu_included():
    import yaml

    import raycpt.evaluate as E
    from raycpt.evaluate.spec import TaskSpec

    files = sorted((PACKAGE / "evaluate" / "benchmarks").glob("*.yaml"))
    names = {yaml.safe_load(f.read_text(encoding="utf-8"))["name"] for f in files}
    assert names == {"wordnet_mc", "mmlu", "ceval", "cmmlu"} and set(BENCHMARKS.names()) == names
    assert BENCHMARKS.names()[0] == "wordnet_mc"
    assert E.HUB_TASKS == {  # what raycpt spelled in code before the YAMLs
        "ceval": TaskSpec("ceval", "hub", "ceval-valid", "ceval_gen", hub_datasets=("ceval/ceval-exam",)),
        "cmmlu": TaskSpec("cmmlu", "hub", "cmmlu", "cmmlu_gen", hub_datasets=("haonan-li/cmmlu",))}
    assert READERS.names() == ("questions", "mmlu")
    from raycpt.cli import COMMANDS

    tasks = next(o for o in COMMANDS["eval"].options if o.name == "tasks")
    assert tasks.help == ("comma-separated: wordnet_mc, mmlu (offline), ceval, cmmlu (hub), FILE.jsonl, "
                          "BENCHMARK.yaml; sets eval.tasks")


def test_a_hub_benchmark_yaml_without_its_datasets_is_one_line(tmp_path):
    from raycpt.evaluate.registry import read_benchmark

    p = tmp_path / "x.yaml"
    p.write_text("name: x\nkind: hub\nlogit: a\ngenerate: b\n", encoding="utf-8")
    with pytest.raises(RaycptError, match=r"kind: hub needs hub:"):
        read_benchmark(p)
