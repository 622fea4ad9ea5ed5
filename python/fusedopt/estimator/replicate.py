"""Multi-tower (in-graph replicated) training of an Estimator ``model_fn``.

A port of ``tf.contrib.estimator.replicate_model_fn`` / ``TowerOptimizer`` (TF 1.x) to
today's TensorFlow, written for ``tf.compat.v1`` graph mode: inside a
``tf.compat.v1.estimator.Estimator`` (TF <= 2.15 with tensorflow-estimator) or called
directly and run with a ``tf.compat.v1.Session`` (any TF 2.x).

How it works:

- ``replicate_model_fn(model_fn, devices=[d0, ..., dN-1])`` returns a ``model_fn`` that
  splits the batch (features and labels: tensors, ``SparseTensor``s, dicts/lists of
  them) into N parts and calls ``model_fn`` once per part ("tower"), tower ``i`` on
  device ``d_i`` under the name scope ``tower_i``. Variables are shared: tower 0
  creates them, towers 1..N-1 reuse them (``tf.compat.v1.get_variable`` with variable
  scope reuse). Variables are placed on a consolidation device (the single GPU, else
  ``/CPU:0``) or round robin over the towers' devices.
- ``TowerOptimizer`` wraps the model_fn's optimizer. ``compute_gradients`` divides the
  loss by N (unless the loss reduction is ``SUM``); ``apply_gradients`` only collects
  the gradients in towers 0..N-2 and, in the last tower, applies once the sum of all
  towers' gradients (dense: ``add_n``; ``IndexedSlices``: values and indices
  concatenated, so repeated rows are summed by the optimizer's sparse update — fused
  optimizers sum them inside the kernel).
- The towers' ``EstimatorSpec``s become one: TRAIN (loss = sum of the towers' scaled
  losses, train op = all towers' train ops), EVAL (metric variables of all towers are
  summed into tower 0's after every update, so e.g. a mean is total/count over the whole
  batch, not an average of per-tower averages), PREDICT (predictions and export outputs
  concatenated along the batch dimension).
"""
import collections
import contextlib
import inspect

import tensorflow as tf

__all__ = ["replicate_model_fn", "TowerOptimizer", "EstimatorSpec", "ModeKeys"]

_Reduction = tf.compat.v1.losses.Reduction


# --- EstimatorSpec / ModeKeys: the real ones when tf.estimator exists ------------------

def _estimator_module():
    try:
        return tf.compat.v1.estimator
    except AttributeError:  # TF >= 2.16: tf.estimator removed
        return None


_SPEC_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops",
                "export_outputs", "training_chief_hooks", "training_hooks", "scaffold",
                "evaluation_hooks", "prediction_hooks")


class _ModeKeys:
    """Same values as ``tf.estimator.ModeKeys``."""
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


class _EstimatorSpec(collections.namedtuple("EstimatorSpec", _SPEC_FIELDS)):
    """Minimal stand-in for ``tf.estimator.EstimatorSpec`` where tf.estimator is absent.

    Same fields and defaults; only the checks replicate_model_fn relies on.
    """

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                export_outputs=None, training_chief_hooks=None, training_hooks=None,
                scaffold=None, evaluation_hooks=None, prediction_hooks=None):
        if mode not in (_ModeKeys.TRAIN, _ModeKeys.EVAL, _ModeKeys.PREDICT):
            raise ValueError("mode must be one of %r, got %r"
                             % ((_ModeKeys.TRAIN, _ModeKeys.EVAL, _ModeKeys.PREDICT), mode))
        if mode == _ModeKeys.TRAIN and (loss is None or train_op is None):
            raise ValueError("Missing loss or train_op in TRAIN mode.")
        if mode == _ModeKeys.EVAL and loss is None:
            raise ValueError("Missing loss in EVAL mode.")
        if mode == _ModeKeys.PREDICT and predictions is None:
            raise ValueError("Missing predictions in PREDICT mode.")
        return super().__new__(
            cls, mode, {} if predictions is None else predictions, loss, train_op,
            dict(eval_metric_ops or {}), export_outputs, tuple(training_chief_hooks or ()),
            tuple(training_hooks or ()), scaffold, tuple(evaluation_hooks or ()),
            tuple(prediction_hooks or ()))


if _estimator_module() is not None:
    EstimatorSpec = _estimator_module().EstimatorSpec
    ModeKeys = _estimator_module().ModeKeys
else:
    EstimatorSpec = _EstimatorSpec
    ModeKeys = _ModeKeys


# --- graph state shared by the towers and the TowerOptimizers ---------------------------

class _GraphState:
    """What the TowerOptimizers of one replicated model_fn call share (one per graph)."""

    def __init__(self):
        self.number_of_towers = 1
        self.loss_reduction = _Reduction.SUM_BY_NONZERO_WEIGHTS
        self.replicating = False  # inside replicate_model_fn's tower loop
        self.tower_index = 0
        self.calls_in_tower = 0  # apply_gradients calls made by the current tower
        self.calls_per_tower = []
        # call index -> [(tower index, optimizer type, grads_and_vars)]
        self.collected = collections.defaultdict(list)
        self.outer_scopes = None  # (VariableScope, name scope) replicate was called in
        self.used = False
        self.shared_variables = None  # refs of the variables existing after tower 0

    @property
    def is_last_tower(self):
        return self.tower_index == self.number_of_towers - 1


def _graph_state(create=True):
    states = tf.compat.v1.get_collection_ref(TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)
    if not states and create:
        states.append(_GraphState())
    return states[0] if states else None


def _clear_graph_state():
    del tf.compat.v1.get_collection_ref(TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)[:]


class TowerOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps an optimizer so that a replicated model_fn applies gradients once.

    Use it inside the ``model_fn`` given to ``replicate_model_fn``::

        optimizer = fusedopt.estimator.TowerOptimizer(
            fusedopt.compat.v1.LazyAdamOptimizer(1e-3))
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

    In every tower ``compute_gradients`` divides the loss by the number of towers
    (unless ``loss_reduction`` is ``SUM``) and ``apply_gradients`` records the
    gradients; the last tower's ``apply_gradients`` applies the sum of all towers'
    gradients with the wrapped optimizer (one update per variable and step, global step
    incremented once). Earlier towers get a no-op train op. A model_fn may call several
    TowerOptimizers (or one several times); every tower must make the same calls.

    Outside ``replicate_model_fn`` it behaves as the wrapped optimizer (and leaves no
    graph state behind).

    Args:
      optimizer_or_optimizer_fn: a ``tf.compat.v1.train.Optimizer`` (any, e.g.
        ``fusedopt.compat.v1.LazyAdamOptimizer``), or a function with no arguments
        returning one (called once, on first use).
    """

    COLLECTION_FOR_GRAPH_STATES = "replicate_model_fn_graph_states"

    def __init__(self, optimizer_or_optimizer_fn):
        opt = optimizer_or_optimizer_fn
        is_optimizer = isinstance(opt, tf.compat.v1.train.Optimizer) or (
            hasattr(opt, "compute_gradients") and hasattr(opt, "apply_gradients"))
        if not is_optimizer and not callable(opt):
            raise TypeError("TowerOptimizer needs a tf.compat.v1.train.Optimizer or a "
                            "function returning one, got %r" % (opt,))
        self._optimizer = opt if is_optimizer else None
        self._optimizer_fn = None if is_optimizer else opt
        super().__init__(use_locking=False, name="TowerOptimizer")

    def _get_optimizer(self):
        if self._optimizer is None:
            opt = self._optimizer_fn()
            if not (hasattr(opt, "compute_gradients") and hasattr(opt, "apply_gradients")):
                raise TypeError("The optimizer_fn given to TowerOptimizer returned %r, not "
                                "a tf.compat.v1.train.Optimizer" % (opt,))
            self._optimizer = opt
        return self._optimizer

    @staticmethod
    def has_been_used():
        """Whether a TowerOptimizer computed or applied gradients in the towers that the
        replicated model_fn is building in the default graph (False outside
        replicate_model_fn: the graph state is cleared when the towers are merged)."""
        state = _graph_state(create=False)
        return bool(state is not None and state.used)

    # --- the tower logic --------------------------------------------------------------

    def compute_gradients(self, loss, *args, **kwargs):
        """The wrapped optimizer's gradients of ``loss / number_of_towers``.

        (Of ``loss`` itself when the reduction is ``SUM`` or there is one tower.)
        """
        state = _graph_state(create=False)
        if state is None:  # outside replicate_model_fn: the wrapped optimizer
            return self._get_optimizer().compute_gradients(loss, *args, **kwargs)
        state.used = True
        if state.number_of_towers > 1 and state.loss_reduction != _Reduction.SUM:
            loss = tf.math.divide(loss, tf.cast(state.number_of_towers, loss.dtype),
                                  name="averaged_loss")
        return self._get_optimizer().compute_gradients(loss, *args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Collects this tower's gradients; the last tower applies all towers' sum."""
        state = _graph_state(create=False)
        grads_and_vars = list(grads_and_vars)
        if state is None or not state.replicating:
            return self._get_optimizer().apply_gradients(grads_and_vars, global_step, name)
        state.used = True

        call = state.calls_in_tower
        state.calls_in_tower += 1
        collected = state.collected[call]
        if len(collected) != state.tower_index:
            raise ValueError(
                "replicate_model_fn: the towers made different optimizer calls: tower %d "
                "made apply_gradients call #%d, which tower(s) %s did not make. The "
                "model_fn must make the same TowerOptimizer calls in every tower."
                % (state.tower_index, call + 1,
                   sorted(set(range(state.tower_index)) - {t for t, _, _ in collected})))
        unshared = [v for _, v in grads_and_vars
                    if state.shared_variables is not None
                    and v.ref() not in state.shared_variables]
        if unshared:
            raise ValueError(_unshared_message(state.tower_index, unshared))
        if collected:
            _check_same_call(collected[0], (state.tower_index, type(self._get_optimizer()),
                                            grads_and_vars), call)
        collected.append((state.tower_index, type(self._get_optimizer()), grads_and_vars))

        if not state.is_last_tower:
            tensors = [t for g, _ in grads_and_vars if g is not None for t in _tensors_of(g)]
            with tf.control_dependencies(tensors):
                return tf.no_op(name="tower_%d_collect_gradients" % state.tower_index)

        summed = []
        for i, (_, var) in enumerate(grads_and_vars):
            grads = [gv[i][0] for _, _, gv in collected if gv[i][0] is not None]
            summed.append((_sum_gradients(grads, var), var))
        # Apply in the scopes replicated_model_fn was called in: slots and non-slot
        # variables are created (variable scope without reuse) and named as without
        # replication, so checkpoints are those of the model_fn alone.
        var_scope, name_scope = state.outer_scopes
        with tf.compat.v1.variable_scope(var_scope, auxiliary_name_scope=False):
            with tf.compat.v1.name_scope(name_scope):
                return self._get_optimizer().apply_gradients(summed, global_step, name)

    # --- delegation --------------------------------------------------------------------

    def get_slot(self, *args, **kwargs):
        return self._get_optimizer().get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._get_optimizer().get_slot_names(*args, **kwargs)

    def get_name(self, *args, **kwargs):
        return self._get_optimizer().get_name(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._get_optimizer().variables(*args, **kwargs)


def _unshared_message(tower, variables):
    return ("replicate_model_fn: tower %d created new trainable variables %s instead of "
            "sharing tower 0's. Create variables with tf.compat.v1.get_variable (or "
            "tf.compat.v1.layers), not tf.Variable." % (tower, [v.name for v in variables]))


def _tensors_of(grad):
    if isinstance(grad, tf.IndexedSlices):
        return [grad.values, grad.indices]
    return [grad]


def _check_same_call(first, this, call):
    tower0, type0, gv0 = first
    tower, type1, gv = this
    vars0 = [v for _, v in gv0]
    vars1 = [v for _, v in gv]
    if type0 is not type1:
        raise ValueError(
            "replicate_model_fn: the towers made different optimizer calls: apply_gradients "
            "call #%d uses %s in tower %d but %s in tower %d."
            % (call + 1, type0.__name__, tower0, type1.__name__, tower))
    if len(vars0) != len(vars1) or any(a is not b for a, b in zip(vars0, vars1)):
        raise ValueError(
            "replicate_model_fn: the towers made different optimizer calls: apply_gradients "
            "call #%d updates %s in tower %d but %s in tower %d (variables must be shared "
            "between towers: create them with tf.compat.v1.get_variable)."
            % (call + 1, [v.name for v in vars0], tower0, [v.name for v in vars1], tower))


def _sum_gradients(grads, var):
    """Sum of the towers' gradients of `var`, next to `var` (None if there are none)."""
    if not grads:
        return None
    if len(grads) == 1:
        return grads[0]
    with tf.device(var.device), tf.compat.v1.name_scope("sum_tower_gradients"):
        if all(isinstance(g, tf.IndexedSlices) for g in grads):
            index_dtype = (tf.int64 if any(g.indices.dtype == tf.int64 for g in grads)
                           else tf.int32)
            return tf.IndexedSlices(
                values=tf.concat([g.values for g in grads], axis=0),
                indices=tf.concat([tf.cast(g.indices, index_dtype) for g in grads], axis=0),
                dense_shape=grads[0].dense_shape)
        return tf.math.add_n([tf.convert_to_tensor(g) for g in grads])


# --- replicate_model_fn -----------------------------------------------------------------

_VARIABLE_OPS = frozenset((
    "Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "MutableHashTable",
    "MutableHashTableV2", "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable", "MutableDenseHashTableV2"))

_PLACEMENTS = ("consolidation", "round_robin")


def _local_devices():
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus:
        return gpus
    return [d.name for d in tf.config.list_logical_devices("CPU")] or ["/device:CPU:0"]


def _consolidation_device(devices):
    if len(devices) == 1:
        return devices[0]
    return "/device:CPU:0"


def _tower_device_fn(tower_device, variable_device_fn):
    def device_fn(op):
        if op.device:  # already placed (colocation or an explicit device)
            return op.device
        if op.type in _VARIABLE_OPS:
            return variable_device_fn(op)
        return tower_device
    return device_fn


def replicate_model_fn(model_fn, loss_reduction=_Reduction.SUM_BY_NONZERO_WEIGHTS,
                       devices=None, *, variable_placement="consolidation"):
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
    if loss_reduction == _Reduction.NONE:
        raise ValueError(
            "replicate_model_fn does not support loss_reduction=NONE: every tower's loss "
            "must be a scalar. Use SUM, MEAN, SUM_OVER_BATCH_SIZE or "
            "SUM_BY_NONZERO_WEIGHTS.")
    if loss_reduction not in _Reduction.all():
        raise ValueError("Unknown loss_reduction %r; expected one of %s"
                         % (loss_reduction, _Reduction.all()))
    if variable_placement not in _PLACEMENTS:
        raise ValueError("variable_placement must be one of %s, got %r"
                         % (_PLACEMENTS, variable_placement))
    if devices is not None:
        devices = list(devices)
        if not devices:
            raise ValueError("replicate_model_fn: devices must not be empty")

    model_fn_params = set(inspect.signature(model_fn).parameters)

    def replicated_model_fn(features, labels, mode, params=None, config=None):
        tower_devices = devices if devices is not None else _local_devices()
        return _build_replicated(model_fn, model_fn_params, features, labels, mode, params,
                                 config, tower_devices, loss_reduction, variable_placement)

    replicated_model_fn.__doc__ = ("%r replicated by fusedopt.estimator.replicate_model_fn"
                                   % (model_fn,))
    return replicated_model_fn


def _build_replicated(model_fn, model_fn_params, features, labels, mode, params, config,
                      devices, loss_reduction, variable_placement):
    if tf.executing_eagerly():
        raise RuntimeError("replicate_model_fn's model_fn builds a tf.compat.v1 graph: call "
                           "it inside `with tf.Graph().as_default():` (as Estimator does).")
    n = len(devices)
    consolidation = _consolidation_device(devices)
    with tf.device(consolidation), tf.compat.v1.name_scope("split_inputs"):
        feature_shards = _split_batch(features, n, "features")
        label_shards = _split_batch(labels, n, "labels")

    if variable_placement == "consolidation":
        def variable_device_fn(op):
            return consolidation
    else:
        counter = [0]

        def variable_device_fn(op):
            device = devices[counter[0] % n]
            counter[0] += 1
            return device

    _clear_graph_state()
    state = _graph_state()
    state.number_of_towers = n
    state.loss_reduction = loss_reduction
    state.replicating = True
    try:
        specs, metric_vars = _build_towers(model_fn, model_fn_params, feature_shards,
                                           label_shards, mode, params, config, devices,
                                           variable_device_fn, state)
        if mode == ModeKeys.TRAIN and n > 1:
            if not state.used:
                raise ValueError(
                    "replicate_model_fn with %d towers needs the model_fn's optimizer "
                    "wrapped in fusedopt.estimator.TowerOptimizer (e.g. "
                    "TowerOptimizer(fusedopt.compat.v1.LazyAdamOptimizer(1e-3))); "
                    "otherwise every tower would update the variables on its own." % n)
            if len(set(state.calls_per_tower)) > 1:
                raise ValueError(
                    "replicate_model_fn: the towers made different optimizer calls: "
                    "apply_gradients calls per tower: %s. The model_fn must make the same "
                    "TowerOptimizer calls in every tower." % state.calls_per_tower)
    finally:
        # Python objects must not stay in a collection: the graph gets serialized.
        _clear_graph_state()
    return _merge_specs(specs, metric_vars, mode, consolidation, loss_reduction)


def _build_towers(model_fn, model_fn_params, feature_shards, label_shards, mode, params,
                  config, devices, variable_device_fn, state):
    kwargs = {}
    if "mode" in model_fn_params:
        kwargs["mode"] = mode
    if "params" in model_fn_params:
        kwargs["params"] = params
    if "config" in model_fn_params:
        kwargs["config"] = config
    has_labels = "labels" in model_fn_params
    specs, metric_vars = [], []
    n = len(devices)
    outer_name_scope = tf.compat.v1.get_default_graph().get_name_scope()
    state.outer_scopes = (tf.compat.v1.get_variable_scope(),
                          outer_name_scope + "/" if outer_name_scope else "")
    for i, device in enumerate(devices):
        state.tower_index = i
        state.calls_in_tower = 0
        metric_collection = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.METRIC_VARIABLES)
        trainable_before = len(tf.compat.v1.trainable_variables())
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, reuse=True if i > 0 else None,
                                         auxiliary_name_scope=False):
            # One tower: no name scope, the graph is that of model_fn alone.
            with (tf.compat.v1.name_scope("tower_%d" % i) if n > 1
                  else contextlib.nullcontext()):
                with tf.compat.v1.device(_tower_device_fn(device, variable_device_fn)):
                    tower_kwargs = dict(kwargs)
                    if has_labels:
                        tower_kwargs["labels"] = label_shards[i]
                    elif label_shards[i] is not None:
                        raise ValueError("model_fn does not take labels, but labels were "
                                         "given")
                    spec = model_fn(feature_shards[i], **tower_kwargs)
        if i > 0 and len(tf.compat.v1.trainable_variables()) != trainable_before:
            raise ValueError(_unshared_message(
                i, tf.compat.v1.trainable_variables()[trainable_before:]))
        if i == 0:
            state.shared_variables = {v.ref() for v in tf.compat.v1.global_variables()}
        state.calls_per_tower.append(state.calls_in_tower)
        specs.append(spec)
        metric_vars.append(tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.METRIC_VARIABLES)[len(metric_collection):])
    return specs, metric_vars


# --- splitting the batch -----------------------------------------------------------------

def _split_batch(value, n, path):
    """``value`` (None, tensor, SparseTensor, dict/list/tuple of them) split into n parts."""
    if value is None:
        return [None] * n
    if isinstance(value, dict):
        parts = {k: _split_batch(v, n, "%s[%r]" % (path, k)) for k, v in value.items()}
        return [type(value)((k, parts[k][i]) for k in value) for i in range(n)]
    if isinstance(value, (tf.SparseTensor, tf.compat.v1.SparseTensorValue)):
        value = tf.SparseTensor.from_value(value)
        if n == 1:
            return [value]
        # Rows split as evenly as possible: the first (rows % n) parts get one more.
        return tf.sparse.split(sp_input=value, num_split=n, axis=0)
    if isinstance(value, (list, tuple)):
        parts = [_split_batch(v, n, "%s[%d]" % (path, j)) for j, v in enumerate(value)]
        shards = [[p[i] for p in parts] for i in range(n)]
        if hasattr(value, "_fields"):  # namedtuple
            return [type(value)(*s) for s in shards]
        return [type(value)(s) for s in shards]
    tensor = tf.convert_to_tensor(value)
    if n == 1:
        return [tensor]
    if tensor.shape.rank == 0:
        raise ValueError("replicate_model_fn: %s is a scalar; cannot split it into %d towers"
                         % (path, n))
    batch = tf.compat.dimension_value(tensor.shape[0]) if tensor.shape.rank else None
    message = ("replicate_model_fn: the batch size of %s is not divisible by the number of "
               "towers (%d); make the batch size a multiple of it" % (path, n))
    if batch is not None:
        if batch % n:
            raise ValueError("%s: batch size %d." % (message, batch))
        return tf.split(tensor, n, axis=0)
    check = tf.compat.v1.assert_equal(tf.math.floormod(tf.shape(tensor)[0], n), 0,
                                      message=message)
    with tf.control_dependencies([check]):
        tensor = tf.identity(tensor)
    return tf.split(tensor, n, axis=0)


# --- merging the towers' specs -----------------------------------------------------------

def _field(spec, name):
    return getattr(spec, name, None)


def _merge_specs(specs, metric_vars, mode, consolidation, loss_reduction):
    n = len(specs)
    first = specs[0]
    kwargs = {"mode": mode}

    losses = [_field(s, "loss") for s in specs]
    if any(loss is not None for loss in losses):
        if any(loss is None for loss in losses):
            raise ValueError("replicate_model_fn: some towers returned a loss and some did "
                             "not")
        with tf.device(consolidation), tf.compat.v1.name_scope("replicated_loss"):
            scaled = [tf.convert_to_tensor(loss) for loss in losses]
            if n > 1 and loss_reduction != _Reduction.SUM:
                scaled = [tf.math.divide(loss, tf.cast(n, loss.dtype)) for loss in scaled]
            kwargs["loss"] = tf.math.add_n(scaled, name="loss") if n > 1 else scaled[0]

    predictions = [_field(s, "predictions") for s in specs]
    if predictions[0] is not None and (not isinstance(predictions[0], dict) or predictions[0]):
        with tf.device(consolidation), tf.compat.v1.name_scope("replicated_predictions"):
            try:
                kwargs["predictions"] = _concat(predictions)
            except ValueError:  # e.g. scalars: TRAIN/EVAL keep tower 0's, PREDICT fails
                if mode == ModeKeys.PREDICT:
                    raise
                kwargs["predictions"] = predictions[0]

    if mode == ModeKeys.TRAIN:
        train_ops = [_field(s, "train_op") for s in specs]
        if n == 1:
            kwargs["train_op"] = train_ops[0]
        else:
            kwargs["train_op"] = tf.group(*[op for op in train_ops if op is not None],
                                          name="replicated_train_op")
    if mode == ModeKeys.EVAL:
        kwargs["eval_metric_ops"] = _merge_metrics(specs, metric_vars, consolidation)
    if mode == ModeKeys.PREDICT and _field(first, "export_outputs"):
        with tf.device(consolidation), tf.compat.v1.name_scope("replicated_export_outputs"):
            kwargs["export_outputs"] = _merge_export_outputs(specs)

    for hooks in ("training_chief_hooks", "training_hooks", "evaluation_hooks",
                  "prediction_hooks"):
        merged = []
        for s in specs:
            for hook in _field(s, hooks) or ():
                if not any(hook is h for h in merged):
                    merged.append(hook)
        if merged:
            kwargs[hooks] = merged
    if _field(first, "scaffold") is not None:
        kwargs["scaffold"] = first.scaffold
    return EstimatorSpec(**kwargs)


def _concat(values):
    """Concatenates the towers' tensors (or dicts of them) along the batch dimension."""
    first = values[0]
    if isinstance(first, dict):
        if any(set(v) != set(first) for v in values):
            raise ValueError("replicate_model_fn: towers returned different prediction keys")
        return {k: _concat([v[k] for v in values]) for k in first}
    if len(values) == 1:
        return first
    if isinstance(first, tf.SparseTensor):
        return tf.sparse.concat(axis=0, sp_inputs=values)
    return tf.concat([tf.convert_to_tensor(v) for v in values], axis=0)


def _merge_export_outputs(specs):
    first = specs[0].export_outputs
    merged = {}
    for key, output in first.items():
        outputs = [s.export_outputs[key] for s in specs]
        cls = type(output)
        kinds = {c.__name__ for c in cls.__mro__}  # tf.estimator.export.*Output (any TF)
        if any(type(o) is not cls for o in outputs):
            raise ValueError("replicate_model_fn: towers returned different export output "
                             "types for %r" % key)
        if "RegressionOutput" in kinds:
            merged[key] = cls(value=_concat([o.value for o in outputs]))
        elif "ClassificationOutput" in kinds:
            scores = (None if output.scores is None
                      else _concat([o.scores for o in outputs]))
            classes = (None if output.classes is None
                       else _concat([o.classes for o in outputs]))
            merged[key] = cls(scores=scores, classes=classes)
        elif "PredictOutput" in kinds:
            merged[key] = cls(outputs=_concat([o.outputs for o in outputs]))
        else:
            raise TypeError("replicate_model_fn cannot merge export output %r of type %s"
                            % (key, cls.__name__))
    return merged


def _merge_metrics(specs, metric_vars, consolidation):
    """One (value, update) per metric, over the whole batch.

    Metrics keep their state in metric variables (e.g. mean: total and count). After
    every tower's update, each variable of towers 1..N-1 is added into tower 0's and
    reset to zero, so tower 0's value tensor reads the state of the whole batch.
    """
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
    if not ops[0]:
        return {}
    if len(specs) == 1:
        return dict(ops[0])
    counts = [len(v) for v in metric_vars]
    if len(set(counts)) > 1:
        raise ValueError("replicate_model_fn: towers created different numbers of metric "
                         "variables: %s" % counts)
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
