"""Shared plumbing of the front ends: one fused update, fused op or composed form.

``apply(rule, variable, slots, grad, hyper, options)`` updates ``variable`` and its
``slots`` in place with fusedopt's op for ``rule`` (dense gradient, or ``tf.IndexedSlices``
-> the sparse op, touched rows only), also inside XLA-compiled steps (the ops have XLA
kernels). ``apply_group`` does the dense updates of many variables with one op per dtype and
device (``resource_group_apply_<rule>``; given a ``_packs.PackCache``, the packed op on
the group's member pack wherever one can be made: one captured handle, not thousands). Only ``composed=True`` (DTensor sharded layouts, where custom ops cannot run)
takes the same rule in composed TF ops (``fusedopt.reference``'s math).
"""

import tensorflow as tf

from fusedopt import ops  # loads the op library now: before the step's XLA compilation
from fusedopt import _packs, reference

__all__ = ["unwrap", "apply", "densify", "every_row_in_kernel", "apply_group", "covers", "covers_gradient", "overridden",
           "groupable", "repeated_variables", "identity", "FUSED_DTYPES", "FUSED_INDEX_DTYPES"]


def _op(rule, sparse):
    return getattr(ops, "resource_%sapply_%s" % ("sparse_" if sparse else "", rule))


def unwrap(variable):
    """The ``tf.Variable`` behind a Keras 3 variable (other variables as they are)."""
    if isinstance(variable, tf.Variable):
        return variable
    for attr in ("_value", "value"):  # keras.Variable holds its tf.Variable in _value
        value = getattr(variable, attr, None)
        if isinstance(value, tf.Variable):
            return value
    return variable


def _read(variable):
    return variable.read_value() if hasattr(variable, "read_value") else tf.convert_to_tensor(
        variable)


def _assign(targets, values):
    # Compact slots (bfloat16/float16 beside a float32 variable) round to nearest on store.
    ops = [t.assign(tf.cast(x, t.dtype), read_value=False) for t, x in zip(targets, values)]
    return None if tf.executing_eagerly() else tf.group(*ops)


def _read_as(variable, dtype):
    value = _read(variable)
    return value if value.dtype == dtype else tf.cast(value, dtype)


def _composed_dense(rule, variable, slots, grad, hyper, options):
    dtype = variable.dtype.base_dtype
    old = [_read(variable)] + [_read_as(s, dtype) for s in slots]
    new = getattr(reference, rule)(old[0], *old[1:], grad, **hyper, **options)
    return _assign([variable] + slots, new)


def _composed_sparse(rule, variable, slots, values, indices, hyper, options):
    """Lazy sparse update in composed ops (XLA-safe form: no tf.unique, no scatter)."""
    dtype = variable.dtype.base_dtype
    new_var, new_slots = reference.masked_sparse_update(
        rule, _read(variable), [_read_as(s, dtype) for s in slots], values, indices, **hyper,
        **options)
    return _assign([variable] + slots, [new_var] + list(new_slots))


def densify(grad, variable):
    """The sparse gradient `grad` (``tf.IndexedSlices``) as a dense gradient of `variable`:
    repeated ids summed, rows no id names zero. An id outside ``[0, rows)`` raises the
    sparse ops' ``InvalidArgumentError`` before anything is updated
    (``reference.check_indices``: ``unsorted_segment_sum`` alone would drop a negative id
    silently). Under XLA, where no check can raise, such an id adds nothing."""
    rows = variable.shape[0] if variable.shape.rank else None
    if rows is None:
        rows = (reference._rows_of(variable) if hasattr(variable, "handle")
                else tf.shape(variable, out_type=tf.int64)[0])
    indices = tf.reshape(grad.indices, [-1])
    if indices.dtype not in (tf.int32, tf.int64):  # what unsorted_segment_sum takes
        indices = tf.cast(indices, tf.int64)
    indices = reference.check_indices(indices, rows)
    return tf.math.unsorted_segment_sum(grad.values, indices, tf.cast(rows, indices.dtype))


def every_row_in_kernel(variable):
    """Whether the sparse op can update every row of `variable` itself (``every_row``:
    the CPU kernels, outside XLA); elsewhere ``densify`` and the dense op do it."""
    if reference._in_xla_context():
        return False
    device = getattr(unwrap(variable), "device", "") or ""
    if device:
        return tf.DeviceSpec.from_string(device).device_type in (None, "CPU")
    return not tf.config.list_logical_devices("GPU")  # placed where TF puts it: a GPU first


def apply(rule, variable, slots, grad, hyper, options=None, composed=False,
          use_locking=False, stochastic_rounding=False, rounding_seed=None, every_row=False):
    """One update of ``variable`` and ``slots`` (in the rule's slot order).

    ``hyper``: dict of the rule's hyper-parameters (numbers or tensors, cast to the
    variable's dtype). The gradient is cast to the variable's dtype first, as Keras does.
    ``every_row``: a sparse gradient updates every row (the others with gradient zero),
    not only the rows it names: the sparse op's ``every_row`` where the CPU kernels run it
    (``every_row_in_kernel``), else the dense op on the ``densify``'d gradient.
    ``stochastic_rounding``: of compact (16-bit) slots; the fused ops only (the composed
    form rounds to nearest and refuses it), with ``rounding_seed`` (the step number).
    Returns the update op in graph mode, None when executing eagerly.
    """
    options = dict(options or {})
    variable = unwrap(variable)
    slots = [unwrap(s) for s in slots]
    dtype = variable.dtype.base_dtype
    if composed and stochastic_rounding and any(s.dtype != dtype for s in slots):
        raise ValueError("stochastic rounding of compact slots runs in fusedopt's ops only; "
                         "the composed form (DTensor layouts) rounds to nearest: "
                         "stochastic_rounding=False there")
    if isinstance(grad, tf.IndexedSlices) and every_row and (
            composed or not every_row_in_kernel(variable)):
        grad = densify(tf.IndexedSlices(tf.cast(grad.values, dtype), grad.indices), variable)
    if isinstance(grad, tf.IndexedSlices):
        values = tf.cast(grad.values, dtype)
        if composed:
            return _composed_sparse(rule, variable, slots, values, grad.indices, hyper,
                                    options)
        return _op(rule, True)(variable, *slots, grad=values, indices=grad.indices,
                               use_locking=use_locking, **hyper, **options,
                               stochastic_rounding=stochastic_rounding,
                               rounding_seed=rounding_seed, every_row=every_row)
    grad = tf.cast(grad, dtype)
    if composed:
        return _composed_dense(rule, variable, slots, grad, hyper, options)
    return _op(rule, False)(variable, *slots, grad=grad, use_locking=use_locking, **hyper,
                            **options, stochastic_rounding=stochastic_rounding,
                            rounding_seed=rounding_seed)


def _allowed_types(variant, attr_name):
    """The dtypes the registered op definition allows for `attr_name` (cc/tf/tf_types.h's
    one list): every rule's ops take the same."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(ops.op_name(next(iter(ops.RULES)), variant))
    (attr,) = [a for a in op_def.attr if a.name == attr_name]
    return frozenset(tf.as_dtype(t) for t in attr.allowed_values.list.type)


# What the fused ops take: other dtypes (complex, integers) run the replaced class's own
# update in every front end.
FUSED_DTYPES = _allowed_types("resource_sparse_apply", "T")
FUSED_INDEX_DTYPES = _allowed_types("resource_sparse_apply", "Tindices")


def covers(variable, indices=None):
    """Whether fusedopt's ops take an update of `variable` (with these sparse `indices`)."""
    try:
        dtype = tf.as_dtype(unwrap(variable).dtype).base_dtype
    except TypeError:
        return False
    return dtype in FUSED_DTYPES and (
        indices is None or tf.as_dtype(indices.dtype) in FUSED_INDEX_DTYPES)


def covers_gradient(grad):
    """covers() from the gradient alone (its dtype is the variable's in Keras)."""
    if isinstance(grad, tf.IndexedSlices):
        return (grad.values.dtype.base_dtype in FUSED_DTYPES
                and grad.indices.dtype in FUSED_INDEX_DTYPES)
    return grad is None or tf.as_dtype(grad.dtype).base_dtype in FUSED_DTYPES


def overridden(obj, name, owner):
    """Whether `obj`'s method `name` is not `owner`'s: a subclass overrides it or the
    instance has its own (a wrapping library's). The front ends group per-variable updates
    into one op only where their own methods would do them: a replacement must still be
    called for every variable."""
    return name in vars(obj) or getattr(type(obj), name, None) is not getattr(owner, name)


def repeated_variables(grads_and_vars):
    """The identities (``identity``) of the variables listed more than once: such a
    variable is updated once per listing (as TF's and Keras's optimizers do it), so none of
    its updates may join a group op, which takes each variable once."""
    seen, repeated = set(), set()
    for _, variable in grads_and_vars:
        key = identity(variable)
        (repeated if key in seen else seen).add(key)
    return repeated


def identity(variable):
    """A hashable identity of a variable (Keras 3 variables: their tf.Variable's)."""
    inner = unwrap(variable)
    return inner.ref() if hasattr(inner, "ref") else id(inner)


def groupable(variable, grad):
    """Whether the group op can take this update: a dense gradient of a resource variable
    of a dtype the ops take."""
    variable = unwrap(variable)
    return (grad is not None and not isinstance(grad, tf.IndexedSlices)
            and isinstance(variable, tf.Variable) and hasattr(variable, "handle")
            and variable.dtype != tf.resource and covers(variable))


def apply_group(rule, updates, hyper_for, options=None, use_locking=False, packs=None,
                stochastic_rounding=False, rounding_seed=None):
    """Dense updates of many variables: one ``resource_group_apply_<rule>`` op per
    (dtype, device) of the variables, in first-seen order.

    ``updates``: [(variable, slots, grad)], every one ``groupable``. ``hyper_for(variable)``
    gives the hyper-parameters dict for a group, from its first variable (they depend on
    the dtype and device only). Gradients are cast to the variable's dtype, as Keras does.
    ``packs``: a ``_packs.PackCache`` to take the groups' member packs from (None: lists).
    Slots of one group op share one dtype: compact slots go to groups of their own.
    ``stochastic_rounding`` with ``rounding_seed``: as ``apply``.
    Returns {variable's ref: its group's op} (graph mode; eager: {}).
    """
    groups = {}
    for variable, slots, grad in updates:
        variable = unwrap(variable)
        slots = [unwrap(s) for s in slots]
        key = (variable.dtype.base_dtype, variable.device,
               slots[0].dtype.base_dtype if slots else None)
        groups.setdefault(key, []).append((variable, slots, grad))
    op = getattr(ops, "resource_group_apply_" + rule)
    packed_op = getattr(ops, "resource_packed_group_apply_" + rule)
    results = {}
    options = {**dict(options or {}), "stochastic_rounding": stochastic_rounding,
               "rounding_seed": rounding_seed}
    for (dtype, device, _), members in groups.items():
        n_slots = len(members[0][1])
        state = [[m[0] for m in members]] + [[m[1][k] for m in members] for k in range(n_slots)]
        grads = [tf.cast(m[2], dtype) for m in members]
        with tf.device(device or None):
            flat = [v for per_kind in state for v in per_kind]
            if packs is not None and _packs.packable(flat):
                result = packed_op(packs.handle(flat, device), **hyper_for(members[0][0]),
                                   grad=grads, use_locking=use_locking, **options)
            else:
                result = op(*state, **hyper_for(members[0][0]), grad=grads,
                            use_locking=use_locking, **options)
        if result is not None:
            results.update((m[0].ref(), result) for m in members)
    return results
