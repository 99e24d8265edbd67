"""lm-eval's tasks for a :class:`~raycpt.evaluate.spec.TaskSpec`: the task manager over raycpt's task folders, the
local benchmarks' task configs, and the tasks one protocol runs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from raycpt.evaluate.spec import OFFLINE_TASK, TaskSpec
from raycpt.tasks.local import check_local, layout, read_subject

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
"""raycpt's lm-eval task YAMLs (``wordnet_mc/``, ``mmlu/``, ``ceval_gen/``, ``cmmlu_gen/``): the folder the task
manager indexes, beside lm-eval's own ``ceval`` and ``cmmlu``."""



@functools.lru_cache(maxsize=1)
def task_manager():
    """The process-wide lm-eval TaskManager over raycpt's tasks plus lm-eval's ceval and cmmlu.

    Only those three folders are indexed (not lm-eval's thousands of task YAMLs), which makes
    construction take well under a second instead of ~7 s; built once per process.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm_tasks = Path(lm_eval.__file__).resolve().parent / "tasks"
    return TaskManager(include_defaults=False,
                       include_path=[str(TASKS_DIR), str(lm_tasks / "ceval"), str(lm_tasks / "cmmlu")])


def _local_task_yamls() -> dict[str, dict[str, tuple[Path, str]]]:
    """{task: {mode: (folder, per-subject YAML name)}}: the lm-eval task config each mode of a local C-Eval /
    CMMLU copy starts from - the hub task's own YAML (prompt, choices, target, metric); only the data source
    is replaced. Cloze starts from the logit YAML too (:data:`LOCAL_CLOZE` says what changes)."""
    import lm_eval

    lm_tasks = Path(lm_eval.__file__).resolve().parent / "tasks"
    return {"ceval": {"logit": (lm_tasks / "ceval", "ceval-valid_{subject}"),
                      "generate": (TASKS_DIR / "ceval_gen", "ceval_gen_{subject}"),
                      "cloze": (lm_tasks / "ceval", "ceval-valid_{subject}")},
            "cmmlu": {"logit": (lm_tasks / "cmmlu", "cmmlu_{subject}"),
                      "generate": (TASKS_DIR / "cmmlu_gen", "cmmlu_gen_{subject}"),
                      "cloze": (lm_tasks / "cmmlu", "cmmlu_{subject}")}}


LOCAL_CLOZE = {
    "ceval": {"task": "ceval_cloze_{subject}", "doc_to_text": "{{question.strip()}}\n答案："},
    "cmmlu": {"task": "cmmlu_cloze_{subject}", "doc_to_text": "{{Question.strip()}}\n答案："},
}
"""Cloze on a local C-Eval / CMMLU copy: the logit task's description, data, target and metric, but the
prompt stops after the question (no lettered options) and the four choices are the option *texts*,
each scored as the continuation right after ``答案：`` (no delimiter: Chinese puts no space there) - the
``mmlu_continuation`` formulation in the benchmark's own language. ``acc`` on the raw log-likelihood, and
lm-eval's ``acc_norm`` (over the option's characters) as the ``cloze_norm`` score."""


def subject_dataset(task: Optional[str] = None, path: Optional[str] = None, **_):
    """lm-eval ``custom_dataset`` of a local subject file: a ``DatasetDict`` with the release's split
    (``val`` for C-Eval, ``test`` for CMMLU), rows as :func:`raycpt.tasks.local.read_subject` reads them. ``task`` and
    ``path`` come from the task config's ``dataset_kwargs``; lm-eval's ``metadata`` keys are ignored."""
    import datasets

    if task is None or path is None:
        raise RaycptError("local benchmark task config: dataset_kwargs needs task and path")
    rows = read_subject(task, path)
    return datasets.DatasetDict({layout(task).split: datasets.Dataset.from_list(rows)})


def local_task_configs(spec: TaskSpec, mode: str, cfg: EvalConfig) -> list[dict]:
    """lm-eval task configs (dicts) of a local benchmark in one mode: one per subject that runs, the
    hub task's YAML with its dataset replaced by the subject's file (:func:`subject_dataset`);
    task names stay the hub's (``ceval-valid_law``, ``cmmlu_gen_arts``), so categories and question ids match.
    Zero-shot: the few-shot split (``dev``) is not read."""
    from lm_eval.tasks._yaml_loader import load_yaml

    table = _local_task_yamls()[spec.name]
    if mode not in table:
        raise RaycptError(f"eval.modes: {spec.name!r} from eval.data_dir has no {mode!r} task; "
                          f"available: {', '.join(table)}")
    folder, name = table[mode]
    out = []
    for subject, path in check_local(spec.name, Path(spec.path), cfg.subjects.get(spec.name)).items():
        conf = load_yaml(folder / f"{name.format(subject=subject)}.yaml", resolve_func=True)
        conf.pop("fewshot_config", None)
        conf.update(custom_dataset=subject_dataset, dataset_path="csv", dataset_name=None, fewshot_split=None,
                    dataset_kwargs={"task": spec.name, "path": str(path)})
        if mode == "cloze":
            cloze = LOCAL_CLOZE[spec.name]
            conf.update(task=cloze["task"].format(subject=subject), doc_to_text=cloze["doc_to_text"],
                        doc_to_choice="{{[A, B, C, D]}}", target_delimiter="",
                        metric_list=[{"metric": m, "aggregation": "mean", "higher_is_better": True}
                                     for m in ("acc", "acc_norm")])
        out.append(conf)
    return out


def _load_local_tasks(spec: TaskSpec, mode: str, cfg: EvalConfig) -> list:
    tasks = list(task_manager().load(local_task_configs(spec, mode, cfg))["tasks"].values())
    if mode == "generate":
        for t in tasks:
            t.set_config(key="generation_kwargs", value={"max_gen_toks": cfg.max_gen_toks, "do_sample": False},
                         update=True)
    return tasks


def load_lm_tasks(spec: TaskSpec, mode: str, cfg: EvalConfig) -> list:
    """Build the lm-eval Task objects of one benchmark in one mode (data is read here)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if spec.kind == "local":
        return _load_local_tasks(spec, mode, cfg)
    tm = task_manager()
    if spec.kind == "file":
        yaml_name = {"logit": "wordnet_mc.yaml", "generate": "wordnet_mc_gen.yaml", "cloze": "wordnet_mc_cloze.yaml"}
        conf = load_yaml(TASKS_DIR / "wordnet_mc" / yaml_name[mode], resolve_func=True)
        conf.update(task=spec.task_of(mode), dataset_kwargs={"questions": spec.path, "reader": spec.reader})
        target: Any = conf
    else:
        target = spec.task_of(mode)
    # mmlu with eval.subjects: only the chosen subjects' tasks (each reads its questions when built)
    targets = ([f"{target}_{s}" for s in cfg.subjects[spec.name]] if spec.kind == "registry"
               and cfg.subjects.get(spec.name) else [target])
    try:
        tasks = list(tm.load(targets)["tasks"].values())
    except RaycptError:
        raise
    except Exception as e:
        if spec.kind == "hub":
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise RaycptError(f"could not load {spec.name!r} ({', '.join(spec.hub_datasets)}) from the Hugging Face "
                              f"hub: {type(e).__name__}: {first}; the offline benchmark is {OFFLINE_TASK!r}") from None
        raise
    if mode == "generate":
        for t in tasks:
            t.set_config(key="generation_kwargs", value={"max_gen_toks": cfg.max_gen_toks, "do_sample": False},
                         update=True)
    return tasks
