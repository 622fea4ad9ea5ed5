"""Every error class of docs/API_SPEC.md: the kernel rejects bad input with the specified
message and leaves var and every slot bit-for-bit unchanged; shape functions reject
statically known bad shapes at graph construction."""

import re

import numpy as np
import pytest
import tensorflow as tf

import error_cases as ec
import fusedopt.ops as fops
import numpy_reference as npref

RULES = npref.RULES
RULE_NAMES = sorted(RULES)


def wrapper(rule, sparse, resource):
    return getattr(fops, "%s%sapply_%s" % ("resource_" if resource else "",
                                          "sparse_" if sparse else "", rule))


CASES, CASE_IDS, Case, _problem = ec.CASES, ec.CASE_IDS, ec.Case, ec.problem


def _assert_unchanged(before, after):
    for i, (b, a) in enumerate(zip(before, after)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), "input %d changed by a rejected call" % i


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_eager_resource(case):
    vs = [tf.Variable(x) for x in case.state()]
    f = wrapper(case.rule, case.sparse, True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=case.message):
        f(*case.args(vs[0], vs[1:], {k: tf.constant(v) for k, v in case.hyper.items()},
                     tf.constant(case.grad),
                     None if case.indices is None else tf.constant(case.indices)))
    _assert_unchanged(case.state(), [v.numpy() for v in vs])


def _graph_run(case, resource):
    """Graph + Session with no static shapes anywhere: only the kernel can object."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        if resource:
            vs = [tf.compat.v1.Variable(x, shape=tf.TensorShape(None), use_resource=True)
                  for x in case.state()]
        else:
            vs = [tf.compat.v1.Variable(x, validate_shape=False, use_resource=False)
                  for x in case.state()]
        for v in vs:
            assert v.shape.rank is None
        ph = lambda x: tf.compat.v1.placeholder(tf.as_dtype(x.dtype), shape=None)  # noqa
        hyper = {k: ph(v) for k, v in case.hyper.items()}
        grad = ph(case.grad)
        indices = None if case.indices is None else ph(case.indices)
        op = wrapper(case.rule, case.sparse, resource)(
            *case.args(vs[0], vs[1:], hyper, grad, indices))
        feed = {hyper[k]: v for k, v in case.hyper.items()}
        feed[grad] = case.grad
        if indices is not None:
            feed[indices] = case.indices
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(tf.errors.InvalidArgumentError, match=case.message):
            sess.run(op, feed)
        _assert_unchanged(case.state(), sess.run(vs))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_graph_ref_unknown_shapes(case):
    _graph_run(case, resource=False)


@pytest.mark.parametrize("case", [c for c in CASES if c.rule == "lazy_adam"],
                         ids=[c.id for c in CASES if c.rule == "lazy_adam"])
def test_graph_resource_unknown_shapes(case):
    _graph_run(case, resource=True)


# --- uninitialized variables -------------------------------------------------------------

@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_uninitialized_variable(rule, sparse, resource):
    case = Case("uninit", rule, sparse, "")
    names = ["var"] + RULES[rule]["slots"]
    for missing in range(len(names)):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            vs = [tf.compat.v1.Variable(x, use_resource=resource) for x in case.state()]
            op = wrapper(rule, sparse, resource)(*case.args(
                vs[0], vs[1:], case.hyper, case.grad, case.indices))
            sess.run([v.initializer for i, v in enumerate(vs) if i != missing])
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match=re.escape("Attempting to use uninitialized variable: "
                                               + names[missing])):
                sess.run(op)
            _assert_unchanged([x for i, x in enumerate(case.state()) if i != missing],
                              sess.run([v for i, v in enumerate(vs) if i != missing]))


# --- dtype mismatch is a graph-construction error --------------------------------------

def test_index_dtype_must_be_integer():
    with tf.Graph().as_default():
        vs = [tf.compat.v1.Variable(np.zeros((4, 2), np.float32), use_resource=False)
              for _ in range(2)]
        with pytest.raises((TypeError, ValueError)):
            fops.sparse_apply_adagrad(vs[0], vs[1], 0.1, 0.1, np.ones((2, 2), np.float32),
                                      tf.constant([0.0, 1.0]))


def test_float_index_rejected_eagerly():
    vs = [tf.Variable(np.zeros((4, 2), np.float32)) for _ in range(2)]
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError,
                        tf.errors.NotFoundError)):
        fops.resource_sparse_apply_adagrad(vs[0], vs[1], 0.1, 0.1,
                                           np.ones((2, 2), np.float32),
                                           tf.constant([0.0, 1.0]))
    for v in vs:
        assert not v.numpy().any()


# --- static shapes: shape functions reject at graph construction --------------------------

STATIC_PROBLEMS = {  # problem -> regex the ValueError must match (spec text or TF's own)
    "grad_shape": r"grad must have the same shape|must be equal|[Dd]imension",
    "var_rank0": r"at least 1-D|at least rank 1|rank",
    "indices_rank2": r"indices must be 1-D|must be rank 1|rank",
    "grad_rank": r"grad must have shape|rank|must be equal",
    "grad_inner": r"grad must have shape|must be equal|[Dd]imension",
    "grad_rank3": r"grad must have shape|rank|must be equal",
    "first_dim": r"first dimension|must be equal|[Dd]imension",
}


def _static_regex(problem):
    m = re.match(r"slot_(\w+)_shape$", problem)
    if m:
        return (r"%s must have the same shape|%s holds one value per row|must be equal|"
                r"[Dd]imension|rank" % (m.group(1), m.group(1)))
    m = re.match(r"hyper_(\w+)_not_scalar$", problem)
    if m:
        return r"%s must be a scalar|must be rank 0|rank 0" % m.group(1)
    return STATIC_PROBLEMS.get(problem)


STATIC_CASES = [c for c in CASES if _static_regex(_problem(c))]


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
@pytest.mark.parametrize("case", STATIC_CASES, ids=[c.id for c in STATIC_CASES])
def test_static_shapes_rejected_at_graph_construction(case, resource):
    with tf.Graph().as_default():
        vs = [tf.compat.v1.Variable(x, use_resource=resource) for x in case.state()]
        with pytest.raises(ValueError, match=_static_regex(_problem(case))):
            wrapper(case.rule, case.sparse, resource)(*case.args(
                vs[0], vs[1:], {k: tf.constant(v) for k, v in case.hyper.items()},
                tf.constant(case.grad),
                None if case.indices is None else tf.constant(case.indices)))


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_static_valid_shapes_build(resource):
    # Control for the test above: the same construction with good shapes succeeds.
    for rule in RULE_NAMES:
        for sparse in (False, True):
            case = Case("good", rule, sparse, "")
            with tf.Graph().as_default():
                vs = [tf.compat.v1.Variable(x, use_resource=resource) for x in case.state()]
                wrapper(rule, sparse, resource)(*case.args(
                    vs[0], vs[1:], {k: tf.constant(v) for k, v in case.hyper.items()},
                    tf.constant(case.grad),
                    None if case.indices is None else tf.constant(case.indices)))


def test_every_error_class_is_covered():
    kinds = {_problem(c) for c in CASES}
    for needed in ["grad_shape", "var_rank0", "indices_rank2", "grad_rank", "grad_inner",
                   "first_dim", "negative_index", "index_eq_rows", "index_after_valid"]:
        assert needed in kinds
    assert any(k.startswith("slot_") for k in kinds)
    assert any(k.startswith("hyper_") for k in kinds)


# --- variables TF's helpers would copy: a wrong dtype must not reach them (issue 16) ------

# Each scenario: one state input of another dtype (float64 among float32), every buffer
# shared by a kept read or every variable in copy-on-read mode (after a gather). TF's
# copy-on-write/read helpers copy with the op's dtype and used to abort the process (CHECK
# failure) before the op's own dtype check ran; now it is an InvalidArgumentError, and
# every variable keeps its bits. Run in a subprocess: the old failure kills the process.
_WRONG_DTYPE_SCRIPT = r'''
import numpy as np, tensorflow as tf
import error_cases as ec, numpy_reference as npref
from test_errors import wrapper
for rule in sorted(npref.RULES):
    names = ["var"] + npref.RULES[rule]["slots"]
    for sparse in (False, True):
        for bad in range(len(names)):
            for how in ("kept_read", "copy_on_read"):
                case = ec.Case("wrong_dtype", rule, sparse, "")
                state = [x.astype(np.float64) if i == bad else x
                         for i, x in enumerate(case.state())]
                vs = [tf.Variable(x) for x in state]
                keep = [v.read_value() if how == "kept_read" else tf.gather(v, [0]) for v in vs]
                name = "%s %s %s %s" % (rule, "sparse" if sparse else "dense", names[bad], how)
                print("START", name, flush=True)
                try:
                    wrapper(rule, sparse, True)(*case.args(
                        vs[0], vs[1:], case.hyper, case.grad.astype(state[0].dtype),
                        case.indices))
                except tf.errors.InvalidArgumentError as e:
                    # The op's dtype is var's: a double var makes the float slots wrong.
                    want = ("%s has dtype float but the update is for double" % names[1] if bad == 0
                            else "%s has dtype double but the update is for float" % names[bad])
                    assert want in e.message, (name, e.message)
                else:
                    raise AssertionError("no error: " + name)
                for v, x in zip(vs, state):
                    assert v.numpy().tobytes() == x.tobytes(), name
                print("OK", name, flush=True)
'''


@pytest.mark.slow
def test_wrong_dtype_variable_with_shared_buffer_is_an_error_not_an_abort():
    import harness

    proc = harness.run_python_in_subprocess(_WRONG_DTYPE_SCRIPT)
    started = [line for line in proc.stdout.splitlines() if line.startswith("START")]
    assert proc.returncode == 0, "%s during %r:\n%s" % (
        harness.describe_exit(proc), started[-1] if started else None, proc.stdout[-3000:])
    # every rule x dense/sparse x each state input x the two ways of sharing
    expected = sum(2 * 2 * (1 + len(spec["slots"])) for spec in npref.RULES.values())
    assert proc.stdout.count("\nOK ") == len(started) == expected


# --- the same variable twice (issue 16) ---------------------------------------------------

def _state_pairs(rule):
    """Every pair (first, second) of the rule's state inputs (var, slots)."""
    names = ["var"] + RULES[rule]["slots"]
    return [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_same_resource_variable_twice_is_an_error(rule, sparse):
    for first, second in _state_pairs(rule):
        case = Case("aliased", rule, sparse, "")
        vs = [tf.Variable(x) for x in case.state()]
        names = ["var"] + RULES[rule]["slots"]
        args = list(vs)
        args[names.index(second)] = vs[names.index(first)]
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=re.escape("%s and %s are the same variable" % (first, second))):
            wrapper(rule, sparse, True)(*case.args(args[0], args[1:], case.hyper, case.grad,
                                                   case.indices))
        _assert_unchanged(case.state(), [v.numpy() for v in vs])


@pytest.mark.parametrize("use_locking", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
def test_same_ref_variable_twice_is_an_error(sparse, use_locking):
    for first, second in _state_pairs("lazy_adam"):
        case = Case("aliased_ref", "lazy_adam", sparse, "")
        names = ["var", "m", "v"]
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            vs = [tf.compat.v1.Variable(x, use_resource=False) for x in case.state()]
            args = list(vs)
            args[names.index(second)] = vs[names.index(first)]
            op = wrapper("lazy_adam", sparse, False)(
                *case.args(args[0], args[1:], case.hyper, case.grad, case.indices),
                use_locking=use_locking)
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=re.escape("%s and %s are the same variable"
                                               % (first, second))):
                sess.run(op)
            _assert_unchanged(case.state(), sess.run(vs))


# --- partly known shapes: our words at graph construction (issue 16) -----------------------

PARTIAL_CASES = [  # (rule, sparse, var shape, {input: placeholder shape}, message)
    ("adagrad", False, (3, 2), {"grad": [None, 3]},
     "grad must have the same shape as var: [3,2] vs [?,3]"),
    ("adagrad", False, (3, 2), {"lr": [None]}, "lr must be a scalar, got shape [?]"),
    ("lazy_adam", True, (5, 2), {"beta2_power": [None, 1]},
     "beta2_power must be a scalar, got shape [?,1]"),
    ("adamax", True, (5, 2), {"indices": [None, None], "grad": [None, 2]},
     "indices must be 1-D, got shape [?,?]"),
    ("adamax", True, (5, 2), {"grad": [None, 4]},
     "grad must have shape [N] + var.shape[1:] = [3,2], got [?,4]"),
    ("adagrad", True, (5, 2), {"grad": [None]},
     "grad must have shape [N] + var.shape[1:] = [3,2], got [?]"),
    ("lazy_adam", True, (5, 2), {"grad": [4, None]},
     "grad and indices must have the same first dimension: 4 vs 3"),
    ("adagrad", True, (), {"grad": [None]}, "var must be at least 1-D, got shape []"),
    ("adagrad", False, (3, 2), {"accum": [None, 3]},
     "accum must have the same shape as var: [3,2] vs [?,3]"),
]


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
@pytest.mark.parametrize("rule,sparse,var_shape,partial,message", PARTIAL_CASES,
                         ids=[c[-1].split(" ")[0] + "-" + str(i)
                              for i, c in enumerate(PARTIAL_CASES)])
def test_partly_known_shapes_rejected_with_the_kernel_message(rule, sparse, var_shape, partial,
                                                              message, resource):
    case = Case("partial", rule, sparse, "", var_shape=var_shape,
                grad_shape=(1,) if var_shape == () else None)
    names = ["var"] + RULES[rule]["slots"]
    if not resource and any(n in partial for n in names):
        pytest.skip("a ref variable's shape is fully known or unknown, never partial")
    with tf.Graph().as_default():
        vs = []
        for name, x in zip(names, case.state()):
            if name in partial:  # a resource variable of partly known shape
                value = np.ones([d or 3 for d in partial[name]], x.dtype)
                vs.append(tf.compat.v1.Variable(value, shape=tf.TensorShape(partial[name]),
                                                use_resource=True))
            else:
                vs.append(tf.compat.v1.Variable(x, use_resource=resource))

        def feed(name, x):
            if name in partial:
                return tf.compat.v1.placeholder(tf.as_dtype(x.dtype), partial[name])
            return tf.constant(x)

        hyper = {k: feed(k, v) for k, v in case.hyper.items()}
        grad = feed("grad", case.grad)
        indices = None if case.indices is None else feed("indices", case.indices)
        with pytest.raises(ValueError, match=re.escape(message)):
            wrapper(rule, sparse, resource)(*case.args(vs[0], vs[1:], hyper, grad, indices))
