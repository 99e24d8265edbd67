"""Hub evaluation data fetched once, on the driver; every Ray worker of the job then reads it offline.

C-Eval and CMMLU (``eval.tasks`` ``ceval`` / ``cmmlu`` without ``eval.data_dir``) are 52 + 67 subject
configs of two Hugging Face hub datasets, which lm-eval reads with ``datasets.load_dataset(path, name)``
when a task is built. Left to the workers, every rank of every trial would fetch all 119 at the end of
its training (rate limits, lock contention on a shared cache). :func:`prefetch_hub_datasets` loads each
config once here, into the datasets cache the workers share (``HF_HOME``, on the shared volume on a
cluster), and then puts ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1`` into
:data:`raycpt.runtime.WORKER_ENV`: the job runtime env of the Ray that :func:`raycpt.runtime.init_ray`
starts or joins next, so that every trial, training worker and evaluation task reads the cache and
never the hub. The driver itself stays online (it may still resolve ``hf:`` models).

Call it before the job's ``ray_session``; a Ray already running keeps the env it was started with.
"""

from __future__ import annotations

import logging
from typing import Sequence

from raycpt import runtime
from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from raycpt.evaluate import hub_offline_reason, resolve_eval_tasks
from raycpt.progress import progress_bar
from raycpt.tasks.local import subjects_of

log = logging.getLogger(__name__)

OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
"""What the workers get once the hub data is in the cache."""


def hub_configs(specs: Sequence) -> list[tuple[str, str]]:
    """``(dataset, subject config)`` of every hub task in ``specs`` (:class:`raycpt.evaluate.TaskSpec`), in
    order: what lm-eval's ``ceval-valid_*`` / ``cmmlu_*`` and raycpt's ``*_gen_*`` tasks load."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        if spec.kind != "hub":
            continue
        for dataset in spec.hub_datasets:
            out.extend((dataset, subject) for subject in subjects_of(spec.name) if (dataset, subject) not in out)
    return out


def prefetch_hub_datasets(eval_cfg: EvalConfig, progress: bool = True, console=None) -> dict[str, str]:
    """Load every hub dataset config ``eval_cfg.tasks`` needs once into the datasets cache (a progress bar),
    then make the next Ray job's workers offline; returns the env they get (``{}`` without hub tasks).

    One line (RaycptError) when a config cannot be loaded: the hub unreachable and the cache without it."""
    configs = hub_configs(resolve_eval_tasks(eval_cfg, check_hub=False))
    if not configs:
        return {}
    import datasets

    with progress_bar("fetching hub eval data", len(configs), enabled=progress, unit="subjects",
                        console=console, transient=True) as advance:
        for dataset, name in configs:
            try:
                datasets.load_dataset(path=dataset, name=name)
            except Exception as e:  # noqa: BLE001 - any failure here is "cannot get the data"
                reason = hub_offline_reason()
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                where = f"the hub is not reachable ({reason})" if reason else f"{type(e).__name__}: {first}"
                raise RaycptError(f"eval.tasks: could not fetch the hub dataset {dataset} ({name}) into the datasets "
                                  f"cache: {where}, and the cache lacks it; fetch it where the hub is reachable "
                                  "(same HF_HOME), set eval.data_dir to a local copy, or use eval.tasks=[wordnet_mc]"
                                  ) from None
            advance(1)
    log.info("hub eval data: %d configs in the datasets cache; Ray workers run with %s", len(configs), OFFLINE_ENV)
    runtime.WORKER_ENV.update(OFFLINE_ENV)
    return dict(OFFLINE_ENV)
