"""Composed-TF-ops implementation of the fusedopt rules (no custom ops).

Used where the custom kernels cannot run (DTensor's sharded layouts) and as a test
oracle. Each rule's math is written once, as ``composed`` in its module
``fusedopt/rules/<rule>.py``; this module gives every rule of the registry a function of
the op's arguments (``lazy_adam(var, m, v, grad, **hyper, **options)`` ->
``(var, m, v)``) and the generic ``apply_dense`` / ``apply_sparse`` /
``masked_sparse_update``, which assign into tf.Variables (resource or ref).
Half/bfloat16 compute in float32 and round the result once, like the kernels.
"""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from fusedopt import rules

RULES = rules.SPECS  # rule -> {"op_name", "slots", "hyper", "options"}

__all__ = ["RULES", *rules.names(), "apply_dense", "apply_sparse", "masked_sparse_update",
           "check_indices"]


def _compute_dtype(dtype):
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _prep(var, values, hypers):
    """(var dtype, [var, *values, *hypers] in the compute dtype).

    Hyper-parameters are first converted/cast to the var dtype, as the ops do; values
    (slots, grad) go straight to the compute dtype (a float32 duplicate-summed grad
    is not rounded back to half first).
    """
    var = tf.convert_to_tensor(var)
    dtype, c = var.dtype, _compute_dtype(var.dtype)
    out = [tf.cast(var, c)] + [tf.cast(t, c) for t in values]
    for h in hypers:
        h = tf.cast(tf.convert_to_tensor(h, dtype_hint=dtype), dtype)
        out.append(tf.cast(h, c))
    return dtype, out


def _call_rule(rule, var, slots, grad, kwargs):
    """(new var, [new slots]) in var's dtype, from the rule's ``composed`` math."""
    if rule not in RULES:
        raise ValueError("unknown rule %r; expected one of %s" % (rule, sorted(RULES)))
    spec = RULES[rule]
    kwargs = dict(kwargs)
    kwargs.pop("use_locking", None)  # accepted for signature parity with the ops
    kwargs.pop("name", None)
    unknown = set(kwargs) - set(spec["hyper"]) - set(spec["options"])
    missing = set(spec["hyper"]) - set(kwargs)
    if unknown or missing:
        raise TypeError("%s: unknown arguments %s, missing hyper-parameters %s"
                        % (rule, sorted(unknown), sorted(missing)))
    slots = list(slots)
    if len(slots) != len(spec["slots"]):
        raise ValueError("%s takes %d slots (%s), got %d"
                         % (rule, len(spec["slots"]), spec["slots"], len(slots)))
    dtype, values = _prep(var, slots + [grad], [kwargs[h] for h in spec["hyper"]])
    n = len(slots)
    hyper = dict(zip(spec["hyper"], values[n + 2:]))
    options = {o: bool(kwargs.get(o, default)) for o, default in spec["options"].items()}
    new_var, new_slots = rules.module(rule).composed(values[0], values[1:n + 1], values[n + 1],
                                                     hyper, options)
    return tf.cast(new_var, dtype), tuple(tf.cast(s, dtype) for s in new_slots)


def _rule_function(rule):
    spec = RULES[rule]

    def fn(var: tf.Tensor, *slots_and_grad: tf.Tensor,
           **hyper_and_options: Any) -> Tuple[tf.Tensor, ...]:
        *slots, grad = slots_and_grad
        new_var, new_slots = _call_rule(rule, var, slots, grad, hyper_and_options)
        return (new_var,) + new_slots

    fn.__name__ = fn.__qualname__ = rule
    fn.__doc__ = (f"{spec['op_name']} in composed TF ops: "
                  f"{rule}(var, {', '.join(spec['slots'])}, grad, **hyper, **options) -> "
                  f"(var, {', '.join(spec['slots'])}) in var's dtype.\n\n"
                  f"``{rules.module(rule).MATH}``")
    return fn


for _rule in RULES:
    globals()[_rule] = _rule_function(_rule)
del _rule


def _result(updates):
    # The grouped op for tf.compat.v1 graphs (to sess.run); None in eager mode and in
    # tf.function, where automatic control dependencies run the updates.
    return None if tf.executing_eagerly() or tf.inside_function() else tf.group(*updates)


def apply_dense(rule: str, var_variable: tf.Variable, slot_variables: Sequence[tf.Variable],
                grad: tf.Tensor, **hyper_and_options: Any) -> Optional[tf.Operation]:
    """var, slots <- rule(var, slots, grad).

    Returns the grouped assign op in v1 graphs, else None.
    """
    slot_variables = list(slot_variables)
    new_var, new_slots = _call_rule(
        rule, var_variable.value(), [s.value() for s in slot_variables], grad,
        hyper_and_options)
    updates = [v.assign(x, read_value=False)
               for v, x in zip([var_variable] + slot_variables, (new_var,) + new_slots)]
    return _result(updates)


def apply_sparse(rule: str, var_variable: tf.Variable, slot_variables: Sequence[tf.Variable],
                 grad: tf.Tensor, indices: tf.Tensor,
                 **hyper_and_options: Any) -> Optional[tf.Operation]:
    """Sparse update: duplicate indices summed, each touched row updated once.

    Rows not in `indices` are never written. Works in graph, eager and
    tf.function(jit_compile=True). Returns the grouped scatter op in v1 graphs, else None.
    """
    slot_variables = list(slot_variables)
    if _in_xla_context():
        new_var, new_slots = masked_sparse_update(
            rule, var_variable.value(), [s.value() for s in slot_variables], grad, indices,
            **hyper_and_options)
        return _result([v.assign(x, read_value=False) for v, x in
                        zip([var_variable] + slot_variables, (new_var,) + tuple(new_slots))])
    grad = tf.convert_to_tensor(grad)
    indices = check_indices(tf.reshape(indices, [-1]), _rows_of(var_variable))
    rows, segments = tf.unique(indices)
    grad = tf.math.unsorted_segment_sum(
        tf.cast(grad, _compute_dtype(grad.dtype)), segments, tf.shape(rows)[0])
    gathered = [tf.gather(v, rows) for v in [var_variable] + slot_variables]
    new_var, new_slots = _call_rule(rule, gathered[0], gathered[1:], grad, hyper_and_options)
    updates = [tf.compat.v1.scatter_update(v, rows, x)
               for v, x in zip([var_variable] + slot_variables, (new_var,) + new_slots)]
    return _result(updates)


def _rows_of(variable: tf.Variable) -> Any:
    """The variable's first dimension without reading it: a dense read (tf.shape(variable))
    would leave a tensor sharing the table's buffer, and the scatter after it would then
    copy the whole table to write the touched rows."""
    rows = variable.shape[0] if variable.shape.rank else None
    if rows is not None:
        return rows
    return tf.raw_ops.VariableShape(input=variable.handle, out_type=tf.int64)[0]


def _in_xla_context():
    if tf.executing_eagerly():
        return False
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _index_error(position, value, rows):
    return "indices[%d] = %d is not in [0, %d)" % (position, value, rows)


def check_indices(indices: tf.Tensor, rows: Any) -> tf.Tensor:
    """`indices` (1-D), once every one is in [0, rows): the ops' rule and message.

    Eagerly it raises InvalidArgumentError at once; in graphs and tf.function the result
    depends on an Assert, so whatever is computed from it (the update) runs only if all
    are valid. Under XLA asserts compile to nothing and no error can be raised at run
    time: there masked_sparse_update writes nothing when an index is bad.
    """
    if _in_xla_context():
        return indices  # string formatting does not compile; the caller masks instead
    rows = tf.cast(rows, indices.dtype)
    bad = tf.logical_or(indices < 0, indices >= rows)
    # The first bad position; len(indices) when there is none (also when empty).
    first = tf.argmax(tf.cast(tf.concat([bad, [True]], 0), tf.int32), output_type=tf.int64)
    if tf.executing_eagerly():
        if bool(tf.reduce_any(bad)):
            i = int(first)
            raise tf.errors.InvalidArgumentError(
                None, None, _index_error(i, int(indices[i]), int(rows)))
        return indices
    value = tf.gather(tf.concat([indices, tf.zeros([1], indices.dtype)], 0), first)
    message = tf.strings.format("indices[{}] = {} is not in [0, {})", (first, value, rows))
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(indices)


def masked_sparse_update(rule: str, var: tf.Tensor, slots: Sequence[tf.Tensor], grad: tf.Tensor,
                         indices: tf.Tensor,
                         **hyper_and_options: Any) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """The sparse update as full-size tensors: (new_var, new_slots).

    Duplicate indices are summed into a var-shaped gradient, the rule runs on every row
    and only touched rows take its values (untouched rows keep their bits). O(rows) work,
    but no tf.unique and no scatter: under XLA, tf.unique of indices that are themselves
    dynamically shaped (e.g. already de-duplicated by Keras 2.15) returns padded values
    and a scatter with them undoes updates. apply_sparse uses this form under XLA.

    An index outside [0, rows) raises InvalidArgumentError as the ops do (check_indices);
    under XLA, which cannot raise, such a call returns var and slots unchanged.
    """
    var = tf.convert_to_tensor(var)
    rows = tf.shape(var)[0]
    indices = check_indices(tf.reshape(indices, [-1]), rows)
    all_valid = tf.reduce_all(tf.logical_and(indices >= 0, indices < tf.cast(rows, indices.dtype)))
    grad = tf.convert_to_tensor(grad)
    summed = tf.math.unsorted_segment_sum(tf.cast(grad, _compute_dtype(grad.dtype)), indices,
                                          rows)
    # How many ids name each row (> 0: touched). A sum, not a max: DTensor lays out
    # UnsortedSegmentSum but not UnsortedSegmentMax; float32 counts cannot overflow to 0.
    touched = tf.math.unsorted_segment_sum(tf.ones_like(indices, tf.float32), indices,
                                           rows) > 0
    touched = tf.logical_and(touched, all_valid)  # XLA: a bad index writes nothing

    def keep_untouched(before, after):  # touched: [rows], along the rows of `before`
        mask = tf.reshape(touched, tf.concat([[rows], tf.ones([tf.rank(before) - 1], tf.int32)], 0))
        return tf.where(mask, after, before)

    slots = [tf.convert_to_tensor(s) for s in slots]
    new_var, new_slots = _call_rule(rule, var, slots, summed, hyper_and_options)
    return (keep_untouched(var, new_var),
            [keep_untouched(before, after) for before, after in zip(slots, new_slots)])
