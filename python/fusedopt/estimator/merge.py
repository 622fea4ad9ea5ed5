"""The towers' ``EstimatorSpec``s merged into one.

TRAIN: loss = sum of the towers' scaled losses, train op = all towers' train ops. EVAL:
metric variables of all towers summed into tower 0's after every update, so e.g. a mean
is total/count over the whole batch, not an average of per-tower averages. PREDICT:
predictions and export outputs concatenated along the batch dimension (scalar export
outputs, one per tower, stacked). Hooks and the scaffold are one tower's, as in contrib:
the last tower's in TRAIN (hooks such as SyncReplicasOptimizer's check calls that only
the last tower's optimizer makes), tower 0's otherwise.
"""
from typing import Any, Dict, Optional, Sequence

import tensorflow as tf

from fusedopt.estimator.spec import EstimatorSpec, ModeKeys

__all__ = ["merge_specs", "concat", "merge_export_outputs", "merge_metrics"]
from fusedopt.estimator.tower_optimizer import Reduction

_HOOK_FIELDS = ("training_chief_hooks", "training_hooks", "evaluation_hooks",
                "prediction_hooks")


def _field(spec, name):
    return getattr(spec, name, None)


def merge_specs(specs: Sequence[Any], metric_vars: Sequence[Any], mode: str, consolidation: str,
                loss_reduction: str) -> Any:
    """One EstimatorSpec for the towers' `specs`; merged tensors on `consolidation`."""
    kwargs = {"mode": mode}
    with tf.device(consolidation):
        kwargs.update(_merged_loss(specs, loss_reduction))
        kwargs.update(_merged_predictions(specs, mode))
    if mode == ModeKeys.TRAIN:
        train_ops = [_field(s, "train_op") for s in specs]
        kwargs["train_op"] = (train_ops[0] if len(specs) == 1 else
                              tf.group(*[op for op in train_ops if op is not None],
                                       name="replicated_train_op"))
    if mode == ModeKeys.EVAL:
        kwargs["eval_metric_ops"] = merge_metrics(specs, metric_vars, consolidation)
    if mode == ModeKeys.PREDICT and _field(specs[0], "export_outputs"):
        with tf.device(consolidation), tf.compat.v1.name_scope("replicated_export_outputs"):
            kwargs["export_outputs"] = merge_export_outputs(specs)
    template = specs[-1] if mode == ModeKeys.TRAIN else specs[0]
    for hooks in _HOOK_FIELDS:
        if _field(template, hooks):
            kwargs[hooks] = list(_field(template, hooks))
    if _field(template, "scaffold") is not None:
        kwargs["scaffold"] = template.scaffold
    return EstimatorSpec(**kwargs)


def _merged_loss(specs, loss_reduction):
    """{"loss": the batch's loss} where the towers returned losses, else {}."""
    losses = [_field(s, "loss") for s in specs]
    if all(loss is None for loss in losses):
        return {}
    if any(loss is None for loss in losses):
        raise ValueError("replicate_model_fn: some towers returned a loss and some did not")
    n = len(specs)
    with tf.compat.v1.name_scope("replicated_loss"):
        scaled = [tf.convert_to_tensor(loss) for loss in losses]
        if n > 1 and loss_reduction != Reduction.SUM:
            scaled = [tf.math.divide(loss, tf.cast(n, loss.dtype)) for loss in scaled]
        return {"loss": tf.math.add_n(scaled, name="loss") if n > 1 else scaled[0]}


def _merged_predictions(specs, mode):
    """{"predictions": the towers' concatenated} where there are any, else {}."""
    predictions = [_field(s, "predictions") for s in specs]
    if predictions[0] is None or (isinstance(predictions[0], dict) and not predictions[0]):
        return {}
    with tf.compat.v1.name_scope("replicated_predictions"):
        try:
            return {"predictions": concat(predictions)}
        except ValueError:  # e.g. scalars: TRAIN/EVAL keep tower 0's, PREDICT fails
            if mode == ModeKeys.PREDICT:
                raise
            return {"predictions": predictions[0]}


def concat(values: Sequence[Any], stack_scalars: bool = False) -> Any:
    """Concatenates the towers' tensors (or dicts of them) along the batch dimension.

    With `stack_scalars`, towers' scalars become a vector of one value per tower.
    """
    first = values[0]
    if isinstance(first, dict):
        if any(set(v) != set(first) for v in values):
            raise ValueError("replicate_model_fn: towers returned different prediction keys")
        return {k: concat([v[k] for v in values], stack_scalars) for k in first}
    if len(values) == 1:
        return first
    if isinstance(first, tf.SparseTensor):
        return tf.sparse.concat(axis=0, sp_inputs=values)
    tensors = [tf.convert_to_tensor(v) for v in values]
    if stack_scalars and all(t.shape.rank == 0 for t in tensors):
        return tf.stack(tensors, axis=0)
    return tf.concat(tensors, axis=0)


def merge_export_outputs(specs: Sequence[Any]) -> Optional[Dict[str, Any]]:
    merged = {}
    for key, output in specs[0].export_outputs.items():
        outputs = [s.export_outputs[key] for s in specs]
        cls = type(output)
        kinds = {c.__name__ for c in cls.__mro__}  # tf.estimator.export.*Output (any TF)
        if any(type(o) is not cls for o in outputs):
            raise ValueError("replicate_model_fn: towers returned different export output "
                             "types for %r" % key)
        def joined(field):
            return None if getattr(output, field) is None else concat(
                [getattr(o, field) for o in outputs], stack_scalars=True)
        if "RegressionOutput" in kinds:
            merged[key] = cls(value=joined("value"))
        elif "ClassificationOutput" in kinds:
            merged[key] = cls(scores=joined("scores"), classes=joined("classes"))
        elif "PredictOutput" in kinds:
            merged[key] = cls(outputs=joined("outputs"))
        else:
            raise TypeError("replicate_model_fn cannot merge export output %r of type %s"
                            % (key, cls.__name__))
    return merged


def _checked_metric_ops(specs):
    """The towers' eval_metric_ops, checked to be (value, update_op) pairs, same keys."""
    ops = [_field(s, "eval_metric_ops") or {} for s in specs]
    if any(set(o) != set(ops[0]) for o in ops):
        raise ValueError("replicate_model_fn: towers returned different eval_metric_ops "
                         "keys: %s" % [sorted(o) for o in ops])
    for o in ops:
        for name, metric in o.items():
            if not (isinstance(metric, (tuple, list)) and len(metric) == 2):
                raise TypeError(
                    "replicate_model_fn: eval metric %r must be a (value, update_op) pair "
                    "(tf.compat.v1.metrics); got %r" % (name, metric))
    return ops


def merge_metrics(specs: Sequence[Any], metric_vars: Sequence[Any],
                  consolidation: str) -> Dict[str, Any]:
    """One (value, update) per metric, over the whole batch.

    Metrics keep their state in metric variables (e.g. mean: total and count). After
    every tower's update, each variable of towers 1..N-1 is added into tower 0's and
    reset to zero, so tower 0's value tensor reads the state of the whole batch.
    """
    ops = _checked_metric_ops(specs)
    if not ops[0]:
        return {}
    if len(specs) == 1:
        return dict(ops[0])
    counts = [len(v) for v in metric_vars]
    if len(set(counts)) > 1:
        raise ValueError(
            "Different `EstimatorSpec.eval_metric_ops` across `model_fn()` calls. Expected "
            "%d local variables, but got %d instead: the towers created %s metric variables."
            % (counts[0] * len(counts), sum(counts), counts))
    update_ops = [update for o in ops for _, update in o.values()]
    reductions = []
    with tf.device(consolidation), tf.compat.v1.name_scope("reduce_metric_variables"):
        with tf.control_dependencies(update_ops):
            for replicas in zip(*metric_vars):
                total = tf.math.add_n([tf.convert_to_tensor(v) for v in replicas])
                gathered = tf.compat.v1.assign(replicas[0], total)
                with tf.control_dependencies([gathered]):
                    for v in replicas[1:]:
                        reductions.append(tf.compat.v1.assign(v, tf.zeros_like(v)))
                reductions.append(gathered)
            reduce_op = tf.group(*(reductions or update_ops), name="reduced_update_op")
    return {name: (value, reduce_op) for name, (value, _) in ops[0].items()}
