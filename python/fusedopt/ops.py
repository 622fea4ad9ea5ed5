"""Thin wrappers over fusedopt's fused update ops, one per op.

Every wrapper takes the variable and its slots (``tf.Variable`` objects for the
``resource_*`` ops; ref variables — ``tf.compat.v1.Variable(use_resource=False)`` in
graph mode — for the others), the hyper-parameters (Python numbers or tensors; cast to
the variable's dtype) and the gradient. Sparse wrappers also take ``indices``: ``grad``
then has shape ``[N] + var.shape[1:]``; duplicate indices are summed before each named
row is updated once, and rows not named are left untouched (lazy updates).

Updates happen in place. Resource wrappers return the op (graph mode) or None (eager);
ref wrappers return the updated variable's ref tensor, as TF's ``Apply*`` ops do.
Bad input raises ``tf.errors.InvalidArgumentError`` and leaves every variable as it was.
"""
import tensorflow as tf

from fusedopt import _loader

# Mirrors the C++ rules (cc/core/rules); tests check the two agree.
RULES = {
    "lazy_adam": dict(op_name="LazyAdam", slots=["m", "v"],
                      hyper=["beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"],
                      options={"use_nesterov": False}),
    "adamax": dict(op_name="Adamax", slots=["m", "v"],
                   hyper=["beta1_power", "lr", "beta1", "beta2", "epsilon"], options={}),
    "adagrad": dict(op_name="Adagrad", slots=["accum"], hyper=["lr", "epsilon"],
                    options={"update_slots": True, "epsilon_inside_sqrt": False}),
}

VARIANTS = ("apply", "resource_apply", "sparse_apply", "resource_sparse_apply")


def op_name(rule, variant):
    """The registered TF op name, e.g. ``FusedOpt>ResourceSparseApplyLazyAdam``."""
    prefix = "".join(part.capitalize() for part in variant.split("_"))
    return "FusedOpt>" + prefix + RULES[rule]["op_name"]


_gradients_declared = False


def load_library():
    """Loads the op library (once) and returns its generated op module."""
    global _gradients_declared
    library = _loader.load_library()
    if not _gradients_declared:
        for rule in RULES:
            for variant in VARIANTS:
                try:
                    tf.no_gradient(op_name(rule, variant))  # updates are not differentiable
                except KeyError:  # already declared (e.g. module reloaded)
                    pass
        _gradients_declared = True
    return library


def _dtype_of(variable):
    dtype = getattr(variable, "dtype", None)
    if dtype is None or dtype == tf.resource:
        raise TypeError("pass the tf.Variable itself (its dtype is needed), not a handle: "
                        f"{variable!r}")
    return dtype.base_dtype


def _state(variable, resource):
    if not resource:
        return variable  # ref inputs convert themselves with as_ref=True
    handle = getattr(variable, "handle", None)
    if handle is None:
        raise TypeError(f"resource ops need a resource tf.Variable, got {variable!r}")
    return handle


def _as_dtype(value, dtype):
    value = tf.convert_to_tensor(value, dtype_hint=dtype)
    return value if value.dtype == dtype else tf.cast(value, dtype)


# Plain graph-building code: autograph has nothing to convert here (and converting the
# loader inside a tf.function only produces warnings).
@tf.autograph.experimental.do_not_convert
def _apply(rule, variant, var, slots, hyper, grad, indices, use_locking, options, name):
    spec = RULES[rule]
    resource = variant.startswith("resource")
    dtype = _dtype_of(var)
    kwargs = {"var": _state(var, resource), "use_locking": use_locking, "name": name}
    for slot_name, slot in zip(spec["slots"], slots):
        kwargs[slot_name] = _state(slot, resource)
    for hyper_name, value in zip(spec["hyper"], hyper):
        kwargs[hyper_name] = _as_dtype(value, dtype)
    kwargs["grad"] = tf.convert_to_tensor(grad, dtype_hint=dtype)
    if indices is not None:
        kwargs["indices"] = indices
    kwargs.update(options)
    fn = getattr(load_library(), f"fused_opt_{variant}_{rule}")
    return fn(**kwargs)


# --- LazyAdam -------------------------------------------------------------------------

def apply_lazy_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad,
                    use_locking=False, use_nesterov=False, name=None):
    """Adam update of a ref variable (TF ``ApplyAdam``'s math); returns the var ref.

    ``m += (g-m)(1-beta1); v += (g²-v)(1-beta2);
    var -= lr·sqrt(1-beta2_power)/(1-beta1_power) · m/(sqrt(v)+epsilon)``.
    """
    return _apply("lazy_adam", "apply", var, (m, v),
                  (beta1_power, beta2_power, lr, beta1, beta2, epsilon), grad, None,
                  use_locking, {"use_nesterov": use_nesterov}, name)


def resource_apply_lazy_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon,
                             grad, use_locking=False, use_nesterov=False, name=None):
    """Adam update of a resource variable (see ``apply_lazy_adam``)."""
    return _apply("lazy_adam", "resource_apply", var, (m, v),
                  (beta1_power, beta2_power, lr, beta1, beta2, epsilon), grad, None,
                  use_locking, {"use_nesterov": use_nesterov}, name)


def sparse_apply_lazy_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon,
                           grad, indices, use_locking=False, use_nesterov=False, name=None):
    """Lazy Adam on the rows of a ref variable named by ``indices``; returns the var ref."""
    return _apply("lazy_adam", "sparse_apply", var, (m, v),
                  (beta1_power, beta2_power, lr, beta1, beta2, epsilon), grad, indices,
                  use_locking, {"use_nesterov": use_nesterov}, name)


def resource_sparse_apply_lazy_adam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2,
                                    epsilon, grad, indices, use_locking=False,
                                    use_nesterov=False, name=None):
    """Lazy Adam on the rows of a resource variable named by ``indices``."""
    return _apply("lazy_adam", "resource_sparse_apply", var, (m, v),
                  (beta1_power, beta2_power, lr, beta1, beta2, epsilon), grad, indices,
                  use_locking, {"use_nesterov": use_nesterov}, name)


# --- Adamax ---------------------------------------------------------------------------

def apply_adamax(var, m, v, beta1_power, lr, beta1, beta2, epsilon, grad, use_locking=False,
                 name=None):
    """Adamax update of a ref variable (TF ``ApplyAdaMax``'s math); returns the var ref.

    ``m += (g-m)(1-beta1); v = max(beta2·v, |g|); var -= lr/(1-beta1_power) · m/(v+epsilon)``.
    """
    return _apply("adamax", "apply", var, (m, v), (beta1_power, lr, beta1, beta2, epsilon),
                  grad, None, use_locking, {}, name)


def resource_apply_adamax(var, m, v, beta1_power, lr, beta1, beta2, epsilon, grad,
                          use_locking=False, name=None):
    """Adamax update of a resource variable (see ``apply_adamax``)."""
    return _apply("adamax", "resource_apply", var, (m, v),
                  (beta1_power, lr, beta1, beta2, epsilon), grad, None, use_locking, {}, name)


def sparse_apply_adamax(var, m, v, beta1_power, lr, beta1, beta2, epsilon, grad, indices,
                        use_locking=False, name=None):
    """Lazy Adamax on the rows of a ref variable named by ``indices``; returns the var ref."""
    return _apply("adamax", "sparse_apply", var, (m, v),
                  (beta1_power, lr, beta1, beta2, epsilon), grad, indices, use_locking, {}, name)


def resource_sparse_apply_adamax(var, m, v, beta1_power, lr, beta1, beta2, epsilon, grad,
                                 indices, use_locking=False, name=None):
    """Lazy Adamax on the rows of a resource variable named by ``indices``."""
    return _apply("adamax", "resource_sparse_apply", var, (m, v),
                  (beta1_power, lr, beta1, beta2, epsilon), grad, indices, use_locking, {}, name)


# --- Adagrad --------------------------------------------------------------------------

def apply_adagrad(var, accum, lr, epsilon, grad, use_locking=False, update_slots=True,
                  epsilon_inside_sqrt=False, name=None):
    """Adagrad update of a ref variable; returns the var ref.

    ``accum += g²`` (if ``update_slots``), then ``var -= lr·g/(sqrt(accum)+epsilon)``
    (TF ``ApplyAdagradV2``, tf_keras), or ``var -= lr·g/sqrt(accum+epsilon)`` with
    ``epsilon_inside_sqrt`` (Keras 3). ``epsilon=0`` is tf.compat.v1's AdagradOptimizer.
    """
    return _apply("adagrad", "apply", var, (accum,), (lr, epsilon), grad, None, use_locking,
                  {"update_slots": update_slots, "epsilon_inside_sqrt": epsilon_inside_sqrt},
                  name)


def resource_apply_adagrad(var, accum, lr, epsilon, grad, use_locking=False, update_slots=True,
                           epsilon_inside_sqrt=False, name=None):
    """Adagrad update of a resource variable (see ``apply_adagrad``)."""
    return _apply("adagrad", "resource_apply", var, (accum,), (lr, epsilon), grad, None,
                  use_locking,
                  {"update_slots": update_slots, "epsilon_inside_sqrt": epsilon_inside_sqrt},
                  name)


def sparse_apply_adagrad(var, accum, lr, epsilon, grad, indices, use_locking=False,
                         update_slots=True, epsilon_inside_sqrt=False, name=None):
    """Adagrad on the rows of a ref variable named by ``indices``; returns the var ref."""
    return _apply("adagrad", "sparse_apply", var, (accum,), (lr, epsilon), grad, indices,
                  use_locking,
                  {"update_slots": update_slots, "epsilon_inside_sqrt": epsilon_inside_sqrt},
                  name)


def resource_sparse_apply_adagrad(var, accum, lr, epsilon, grad, indices, use_locking=False,
                                  update_slots=True, epsilon_inside_sqrt=False, name=None):
    """Adagrad on the rows of a resource variable named by ``indices``."""
    return _apply("adagrad", "resource_sparse_apply", var, (accum,), (lr, epsilon), grad,
                  indices, use_locking,
                  {"update_slots": update_slots, "epsilon_inside_sqrt": epsilon_inside_sqrt},
                  name)


def xla_cpu_lowering():
    """How the resource ops run inside XLA-compiled steps on the CPU: "custom_call" (the CPU
    engine itself, called from XLA; TF >= 2.16, whose XLA has the typed FFI) or "hlo" (the
    rule built as XLA operations; also what XLA:GPU runs, and FUSEDOPT_XLA_LOWERING=hlo)."""
    import os

    if os.environ.get("FUSEDOPT_XLA_LOWERING") == "hlo":
        return "hlo"
    header = os.path.join(tf.sysconfig.get_include(), "xla", "ffi", "api", "ffi.h")
    return "custom_call" if os.path.exists(header) else "hlo"


# Loaded at import, not on first use: XLA lists its JIT kernels at the process's first XLA
# compilation, and ops registered before that take the normal path (a library loaded later
# registers its XLA kernels itself).
load_library()
