"""``TowerOptimizer``: gradients of all towers collected, summed and applied once.

The towers of one replicated model_fn and their TowerOptimizers share a ``GraphState``,
kept in a graph collection while replicate_model_fn builds the towers.
"""
import collections
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

__all__ = ["Reduction", "COLLECTION_FOR_GRAPH_STATES", "SAME_CALLS", "GraphState", "graph_state",
           "clear_graph_state", "TowerOptimizer", "unshared_message"]

Reduction = tf.compat.v1.losses.Reduction

COLLECTION_FOR_GRAPH_STATES = "replicate_model_fn_graph_states"

# contrib's words: users and tests match on them
SAME_CALLS = "Each invocation of model_fn was supposed to make the same optimizer calls:"


class GraphState:
    """What the TowerOptimizers of one replicated model_fn call share (one per graph)."""

    def __init__(self):
        self.number_of_towers = 1
        self.loss_reduction = Reduction.SUM_BY_NONZERO_WEIGHTS
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
    def is_last_tower(self) -> bool:
        return self.tower_index == self.number_of_towers - 1


def graph_state(create: bool = True) -> Optional["GraphState"]:
    """The default graph's GraphState; None where there is none and `create` is False."""
    states = tf.compat.v1.get_collection_ref(COLLECTION_FOR_GRAPH_STATES)
    if not states and create:
        states.append(GraphState())
    return states[0] if states else None


def clear_graph_state() -> None:
    del tf.compat.v1.get_collection_ref(COLLECTION_FOR_GRAPH_STATES)[:]


def _is_optimizer(value):
    return isinstance(value, tf.compat.v1.train.Optimizer) or (
        hasattr(value, "compute_gradients") and hasattr(value, "apply_gradients"))


class TowerOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps an optimizer so that a replicated model_fn applies gradients once.

    Use it inside the ``model_fn`` given to ``replicate_model_fn``:

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

    COLLECTION_FOR_GRAPH_STATES = COLLECTION_FOR_GRAPH_STATES

    def __init__(self, optimizer_or_optimizer_fn: Union[
            tf.compat.v1.train.Optimizer, Callable[[], tf.compat.v1.train.Optimizer]]) -> None:
        opt = optimizer_or_optimizer_fn
        is_optimizer = _is_optimizer(opt)
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
    def has_been_used() -> bool:
        """Whether a TowerOptimizer computed or applied gradients in the towers that the
        replicated model_fn is building in the default graph (False outside
        replicate_model_fn: the graph state is cleared when the towers are merged)."""
        state = graph_state(create=False)
        return bool(state is not None and state.used)

    # --- the tower logic --------------------------------------------------------------

    def compute_gradients(self, loss: tf.Tensor, *args: Any,
                          **kwargs: Any) -> List[Tuple[Optional[tf.Tensor], tf.Variable]]:
        """The wrapped optimizer's gradients of ``loss / number_of_towers``.

        (Of ``loss`` itself when the reduction is ``SUM`` or there is one tower.)
        """
        state = graph_state(create=False)
        if state is None:  # outside replicate_model_fn: the wrapped optimizer
            return self._get_optimizer().compute_gradients(loss, *args, **kwargs)
        state.used = True
        if state.number_of_towers > 1 and state.loss_reduction != Reduction.SUM:
            loss = tf.math.divide(loss, tf.cast(state.number_of_towers, loss.dtype),
                                  name="averaged_loss")
        return self._get_optimizer().compute_gradients(loss, *args, **kwargs)

    def apply_gradients(self, grads_and_vars: Sequence[Tuple[Optional[tf.Tensor], tf.Variable]],
                        global_step: Optional[tf.Variable] = None,
                        name: Optional[str] = None) -> tf.Operation:
        """Collects this tower's gradients; the last tower applies all towers' sum."""
        state = graph_state(create=False)
        grads_and_vars = list(grads_and_vars)
        if state is None or not state.replicating:
            return self._get_optimizer().apply_gradients(grads_and_vars, global_step, name)
        state.used = True
        collected = self._collect(state, grads_and_vars)
        if not state.is_last_tower:
            tensors = [t for g, _ in grads_and_vars if g is not None for t in _tensors_of(g)]
            with tf.control_dependencies(tensors):
                return tf.no_op(name="tower_%d_collect_gradients" % state.tower_index)
        summed = _sum_towers(collected, grads_and_vars)
        # Apply in the scopes replicated_model_fn was called in: slots and non-slot
        # variables are created (variable scope without reuse) and named as without
        # replication, so checkpoints are those of the model_fn alone.
        var_scope, name_scope = state.outer_scopes
        with tf.compat.v1.variable_scope(var_scope, auxiliary_name_scope=False):
            with tf.compat.v1.name_scope(name_scope):
                return self._get_optimizer().apply_gradients(summed, global_step, name)

    def _collect(self, state, grads_and_vars):
        """Records this tower's call after checking it matches the earlier towers' same
        call; returns all towers' records of that call so far."""
        call = state.calls_in_tower
        state.calls_in_tower += 1
        collected = state.collected[call]
        if len(collected) != state.tower_index:
            raise ValueError(
                "%s the towers made different optimizer calls: tower %d made "
                "apply_gradients call #%d, which tower(s) %s did not make."
                % (SAME_CALLS, state.tower_index, call + 1,
                   sorted(set(range(state.tower_index)) - {t for t, _, _ in collected})))
        unshared = [v for _, v in grads_and_vars
                    if state.shared_variables is not None
                    and v.ref() not in state.shared_variables]
        if unshared:
            raise ValueError(unshared_message(state.tower_index, unshared))
        this = (state.tower_index, type(self._get_optimizer()), grads_and_vars)
        if collected:
            _check_same_call(collected[0], this, call)
        collected.append(this)
        return collected

    # --- delegation --------------------------------------------------------------------

    def get_slot(self, *args: Any, **kwargs: Any) -> Optional[tf.Variable]:
        return self._get_optimizer().get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> List[str]:
        return self._get_optimizer().get_slot_names(*args, **kwargs)

    def get_name(self, *args: Any, **kwargs: Any) -> str:
        return self._get_optimizer().get_name(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> List[tf.Variable]:
        return self._get_optimizer().variables(*args, **kwargs)


def unshared_message(tower: int, variables: Sequence[Any]) -> str:
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
            "%s the towers made different optimizer calls: apply_gradients call #%d uses "
            "%s in tower %d but %s in tower %d."
            % (SAME_CALLS, call + 1, type0.__name__, tower0, type1.__name__, tower))
    if len(vars0) != len(vars1) or any(a is not b for a, b in zip(vars0, vars1)):
        raise ValueError(
            "%s the towers made different optimizer calls: apply_gradients call #%d "
            "updates %s in tower %d but %s in tower %d (variables must be shared between "
            "towers: create them with tf.compat.v1.get_variable)."
            % (SAME_CALLS, call + 1, [v.name for v in vars0], tower0,
               [v.name for v in vars1], tower))


def _sum_towers(collected, grads_and_vars):
    """[(sum of all towers' gradients of var, var)], in the order of this call's vars."""
    summed = []
    for i, (_, var) in enumerate(grads_and_vars):
        grads = [gv[i][0] for _, _, gv in collected if gv[i][0] is not None]
        summed.append((_sum_gradients(grads, var), var))
    return summed


def _sum_gradients(grads, var):
    """Sum of the towers' gradients of `var`, next to `var` (None if there are none).

    ``IndexedSlices`` are concatenated, not densified: repeated rows are summed by the
    optimizer's sparse update (fused optimizers sum them inside the kernel).
    """
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
