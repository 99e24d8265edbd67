"""LISA in the training worker: a new interval trains its own draw of layers (:func:`lisa_switch`)."""

from __future__ import annotations

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack
from raycpt.strategies import apply_plan, lisa_interval_index, param_groups
from raycpt.train.worker.steps import trainable_params
from raycpt.train.worker.state import WorkerState


def lisa_switch(w: WorkerState, step: int) -> bool:
    """LISA: when ``step`` opens a new interval, train that interval's draw (:meth:`LayerPlan.at_step`) and
    reset the AdamW state of every decoder layer, keeping that of the embeddings, final norm and head (LMFlow's
    ``LISATrainer`` builds a new optimizer per interval and copies the state of its non-layer groups only). The
    optimizer's groups then hold exactly the draw's parameters (the freeze check's "in the optimizer"); the
    scheduler is untouched. Returns whether it switched."""
    plan = w.plan
    if not plan.is_lisa or lisa_interval_index(step, plan.lisa_interval) == \
            lisa_interval_index(max(w.step_plan_step, 1), plan.lisa_interval):
        return False
    new = plan.at_step(step)
    for layer in LayerStack.of(w.model).layers:
        for p in layer.parameters():
            w.optimizer.state.pop(p, None)
    w.counts = apply_plan(w.model, new)
    lists = {(g["lr_scale"], g["decay"]): g["params"]
             for g in param_groups(w.model, new, w.cfg.train.lr, w.cfg.train.weight_decay)}
    for g in w.optimizer.param_groups:
        g["params"] = lists.pop((g["lr_scale"], g["decay"]), [])
    if lists:
        raise RaycptError(f"lisa: interval of step {step} needs optimizer groups {sorted(lists)} the run lacks")
    w.params = trainable_params(w.wrapped)
    w.step_plan, w.step_plan_step = new, step
    if w.logger is not None:
        w.logger.event({"event": "lisa_draw", "step": step, "interval": lisa_interval_index(step, plan.lisa_interval),
                        "layers": list(new.trainable_layers), "trainable": w.counts["trainable"]})
    return True



def lisa_step_metrics(step_plan) -> dict:
    """LISA: the layers this step trained, as the step's metrics ``lisa/layer_<j>`` (the j-th of the draw, in
    layer order): every step's draw is in the trial's records and its MLflow run; {} for any other plan."""
    if not step_plan.is_lisa:
        return {}
    return {f"lisa/layer_{j}": float(i) for j, i in enumerate(step_plan.trainable_layers)}
