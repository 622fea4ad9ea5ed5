"""``replicate_model_fn``: an Estimator ``model_fn`` run as one tower per device.

A port of ``tf.contrib.estimator.replicate_model_fn`` (TF 1.x) to today's TensorFlow,
written for ``tf.compat.v1`` graph mode: inside a ``tf.compat.v1.estimator.Estimator``
(TF <= 2.15 with tensorflow-estimator) or called directly and run with a
``tf.compat.v1.Session`` (any TF 2.x).

The returned model_fn splits the batch (``split.py``) into N parts and calls ``model_fn``
once per part ("tower"), tower ``i`` on device ``d_i`` under the name scope ``tower_i``.
Variables are shared: tower 0 creates them, towers 1..N-1 reuse them
(``tf.compat.v1.get_variable`` with variable scope reuse), placed as ``placement.py``
says. The model_fn's ``TowerOptimizer`` (``tower_optimizer.py``) applies the sum of
all towers' gradients once; the towers' specs become one (``merge.py``).
"""
import contextlib
import copy
import functools
import inspect
from typing import Callable, Optional, Sequence

import tensorflow as tf

from fusedopt.estimator.merge import merge_specs
from fusedopt.estimator.placement import (PLACEMENTS, canonical_device, consolidation_device,
                                          local_devices, tower_device_fn, variable_device_fn)
from fusedopt.estimator.spec import ModeKeys
from fusedopt.estimator.split import split_batch
from fusedopt.estimator.tower_optimizer import (SAME_CALLS, Reduction, clear_graph_state,
                                                graph_state, unshared_message)

__all__ = ["replicate_model_fn"]


def replicate_model_fn(model_fn: Callable, loss_reduction: str = Reduction.SUM_BY_NONZERO_WEIGHTS,
                       devices: Optional[Sequence[str]] = None, *,
                       variable_placement: str = "consolidation") -> Callable:
    """Replicates ``model_fn`` over ``devices``: one tower per device, one batch split.

    Args:
      model_fn: an Estimator model_fn ``(features, labels, mode[, params][, config])``
        returning an ``EstimatorSpec``. It must create its variables with
        ``tf.compat.v1.get_variable`` (or layers that do, e.g. ``tf.compat.v1.layers``)
        so that towers share them, and, with several towers, wrap its optimizer in
        ``TowerOptimizer``.
      loss_reduction: the ``tf.compat.v1.losses.Reduction`` of each tower's loss. Except
        for ``SUM``, the towers' losses (and gradients) are divided by the number of
        towers, so that with equal tower batches the result is the loss of the whole
        batch. ``NONE`` is not allowed (the loss must be a scalar).
      devices: device names, one tower each. None: all local GPUs, else all local CPU
        devices (normally one: ``/device:CPU:0``).
      variable_placement: ``"consolidation"`` (default): all variables on one device, the
        GPU with a single GPU, else ``/device:CPU:0``; ``"round_robin"``: variables
        spread over ``devices`` in creation order.

    Returns:
      A model_fn ``(features, labels, mode, params=None, config=None)`` returning one
      ``EstimatorSpec`` (``fusedopt.estimator.EstimatorSpec``: tf.estimator's where it
      exists). The batch size of every dense feature and label must be divisible by the
      number of towers (``SparseTensor``s may split unevenly).

    Raises:
      ValueError: ``loss_reduction`` is NONE or unknown, ``devices`` is empty, or
        ``variable_placement`` is unknown.
    """
    devices = None if devices is None else [canonical_device(d) for d in devices]
    _check_arguments(loss_reduction, devices, variable_placement)
    model_fn_params = model_fn_arguments(model_fn)

    def replicated_model_fn(features, labels, mode, params=None, config=None):
        tower_devices = devices if devices is not None else local_devices()
        return _build_replicated(model_fn, model_fn_params, features, labels, mode, params,
                                 config, tower_devices, loss_reduction, variable_placement)

    replicated_model_fn.__doc__ = ("%r replicated by fusedopt.estimator.replicate_model_fn"
                                   % (model_fn,))
    return replicated_model_fn


def model_fn_arguments(model_fn):
    """The names among features/labels/mode/params/config that model_fn takes.

    As Estimator decides: by name, in any order; arguments a ``functools.partial`` binds
    by keyword are not passed again; ``**kwargs`` receives nothing.
    """
    try:
        parameters = inspect.signature(model_fn).parameters
    except (TypeError, ValueError) as error:
        raise TypeError("replicate_model_fn: cannot read the arguments of model_fn %r: %s"
                        % (model_fn, error)) from None
    names = {name for name, p in parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if isinstance(model_fn, functools.partial):
        names -= set(model_fn.keywords)
    if "features" not in names:
        raise ValueError("model_fn (%r) must include features argument." % (model_fn,))
    return names & {"features", "labels", "mode", "params", "config"}


def _check_arguments(loss_reduction, devices, variable_placement):
    # Contrib's words first (users and tests match on them), then ours.
    if loss_reduction == Reduction.NONE:
        raise ValueError(
            "Tower losses need to be reduced in some way, yet none reduction is specified: "
            "replicate_model_fn does not support loss_reduction=NONE (every tower's loss "
            "must be a scalar). Use SUM, MEAN, SUM_OVER_BATCH_SIZE or "
            "SUM_BY_NONZERO_WEIGHTS.")
    if loss_reduction not in Reduction.all():
        raise ValueError("Unknown loss_reduction %r; expected one of %s"
                         % (loss_reduction, Reduction.all()))
    if variable_placement not in PLACEMENTS:
        raise ValueError("variable_placement must be one of %s, got %r"
                         % (PLACEMENTS, variable_placement))
    if devices == []:
        raise ValueError("replicate_model_fn: devices must not be empty")


def _tower_inputs(model_fn_params, features, labels, mode, params, config, n):
    """The keyword arguments of each tower's model_fn call.

    By keyword and only those model_fn takes, as Estimator calls a model_fn. params and
    config are copied per tower (as contrib did), so a model_fn that changes them (e.g.
    ``params.pop``) sees the same values in every tower.
    """
    if "labels" not in model_fn_params and labels is not None:
        raise ValueError("model_fn does not take labels, but input_fn returns labels.")
    feature_shards = split_batch(features, n, "features")
    label_shards = split_batch(labels, n, "labels")
    towers = []
    for i in range(n):
        kwargs = {"features": feature_shards[i], "labels": label_shards[i], "mode": mode,
                  "params": _copied(params), "config": _copied(config)}
        towers.append({k: v for k, v in kwargs.items() if k in model_fn_params})
    return towers


def _copied(value):
    try:
        return copy.deepcopy(value)
    except Exception:  # pylint: disable=broad-except
        # e.g. graph tensors or locks inside params: passed as they are
        return value


def _build_replicated(model_fn, model_fn_params, features, labels, mode, params, config,
                      devices, loss_reduction, variable_placement):
    if tf.executing_eagerly():
        raise RuntimeError("replicate_model_fn's model_fn builds a tf.compat.v1 graph: call "
                           "it inside `with tf.Graph().as_default():` (as Estimator does).")
    n = len(devices)
    consolidation = consolidation_device(devices)
    with tf.device(consolidation), tf.compat.v1.name_scope("split_inputs"):
        inputs = _tower_inputs(model_fn_params, features, labels, mode, params, config, n)
    variable_device = variable_device_fn(variable_placement, devices, consolidation)
    clear_graph_state()
    state = graph_state()
    state.number_of_towers = n
    state.loss_reduction = loss_reduction
    state.replicating = True
    try:
        specs, metric_vars = _build_towers(model_fn, inputs, devices, variable_device, state)
        if mode == ModeKeys.TRAIN and n > 1:
            _check_optimizer_calls(state)
    finally:
        # Python objects must not stay in a collection: the graph gets serialized.
        clear_graph_state()
    return merge_specs(specs, metric_vars, mode, consolidation, loss_reduction)


def _check_optimizer_calls(state):
    """With several towers in TRAIN mode: each tower made the same TowerOptimizer calls."""
    if not state.used:
        raise ValueError(
            "Please wrap optimizers with TowerOptimizer in order to use "
            "replicate_model_fn with multiple `devices`: with %d towers the model_fn's "
            "optimizer must be wrapped in fusedopt.estimator.TowerOptimizer (e.g. "
            "TowerOptimizer(fusedopt.compat.v1.LazyAdamOptimizer(1e-3))); "
            "otherwise every tower would update the variables on its own."
            % state.number_of_towers)
    if len(set(state.calls_per_tower)) > 1:
        raise ValueError(
            "%s the towers made different optimizer calls: apply_gradients calls per "
            "tower: %s." % (SAME_CALLS, state.calls_per_tower))


def _build_towers(model_fn, inputs, devices, variable_device, state):
    """Calls model_fn once per tower: [spec], [[metric variables it created]] per tower."""
    outer_name_scope = tf.compat.v1.get_default_graph().get_name_scope()
    state.outer_scopes = (tf.compat.v1.get_variable_scope(),
                          outer_name_scope + "/" if outer_name_scope else "")
    specs, metric_vars = [], []
    for i, (device, kwargs) in enumerate(zip(devices, inputs)):
        state.tower_index = i
        state.calls_in_tower = 0
        metrics_before = len(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES))
        trainable_before = len(tf.compat.v1.trainable_variables())
        specs.append(_call_in_tower(model_fn, kwargs, i, len(devices),
                                    tower_device_fn(device, variable_device)))
        if i > 0 and len(tf.compat.v1.trainable_variables()) != trainable_before:
            raise ValueError(unshared_message(
                i, tf.compat.v1.trainable_variables()[trainable_before:]))
        if i == 0:
            state.shared_variables = {v.ref() for v in tf.compat.v1.global_variables()}
        state.calls_per_tower.append(state.calls_in_tower)
        metric_vars.append(tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.METRIC_VARIABLES)[metrics_before:])
    return specs, metric_vars


def _call_in_tower(model_fn, kwargs, tower, number_of_towers, device_fn):
    """model_fn in tower `tower`'s scopes: variables reused after tower 0.

    Tower 0 has no name scope (as in contrib): names without a prefix are those of the
    model_fn alone (tower 0's ops), towers 1..N-1 are under ``tower_<i>/``.
    """
    del number_of_towers
    scope = tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(scope, reuse=True if tower > 0 else None,
                                     auxiliary_name_scope=False):
        with (tf.compat.v1.name_scope("tower_%d" % tower) if tower > 0
              else contextlib.nullcontext()):
            with tf.compat.v1.device(device_fn):
                return model_fn(**kwargs)
