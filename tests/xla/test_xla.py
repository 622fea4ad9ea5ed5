"""The resource ops inside XLA-compiled functions (tf.function(jit_compile=True)).

On the CPU two lowerings exist (cc/tf/xla_kernels.cc): "custom_call" (TF >= 2.16: XLA calls
the CPU engine itself) must equal the op run without XLA bit for bit; "hlo" (the rule built as
XLA operations from the same rule code, duplicates summed in the same order; XLA:GPU's
lowering, and TF 2.15's) within HLO_ULPS, because XLA contracts multiply-adds. For every
rule, option set, dtype and index type, with duplicates, hot rows and empty batches. The "hlo" cases run in a child process with
FUSEDOPT_XLA_LOWERING=hlo (the choice is read when a step compiles, and compiled steps are
cached per process); there each sparse case takes one of the two index types, alternating
(sparse_cases), and TF 2.15's stage, whose own lowering is "hlo", runs every pair.
"""
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import harness
import numpy_reference as npref
from fusedopt import ops

RULES = sorted(npref.RULES)
DTYPES = ["half", "bfloat16", "float", "double"]
CHILD = os.environ.get("FUSEDOPT_TEST_XLA_CHILD") == "1"
LOWERING = ops.xla_cpu_lowering()


def op_for(rule, sparse):
    return getattr(ops, "resource_%sapply_%s" % ("sparse_" if sparse else "", rule))


def make_case(rule, dtype, sparse, index_dtype, seed, shape=(50, 3), ids=None):
    rng = np.random.default_rng(seed)
    var, slots = harness.make_state(rule, shape, dtype, rng)
    if sparse:
        if ids is None:
            ids = harness.make_indices(120, shape[0], index_dtype, rng)
        grad = harness.make_grad((len(ids),) + shape[1:], dtype, rng)
    else:
        grad = harness.make_grad(shape, dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 3)
    return var, slots, grad, (None if ids is None else np.asarray(ids, index_dtype)), hyper


def run(rule, options, dtype, case, jit):
    """One update, with or without XLA; returns (var, slots) as NumPy."""
    var0, slots0, grad, ids, hyper = case
    variables = [tf.Variable(x) for x in [var0] + slots0]
    op = op_for(rule, ids is not None)
    tf_dtype = harness.TF_DTYPES[dtype]

    def step(grad, ids, hyper):
        kwargs = dict(grad=grad, **hyper, **options)
        if ids is not None:
            kwargs["indices"] = ids
        op(variables[0], *variables[1:], **kwargs)

    fn = tf.function(step, jit_compile=jit)
    fn(tf.constant(grad), None if ids is None else tf.constant(ids),
       {k: tf.constant(v, tf_dtype) for k, v in hyper.items()})
    return variables[0].numpy(), [v.numpy() for v in variables[1:]]


def jit(fn):
    """tf.function(jit_compile=True) of fn, its result dropped (the ops return an Operation)."""
    return tf.function(lambda *args: [fn(*args), None][1], jit_compile=True)


# The HLO lowering's bound (cc/tf/xla_kernels.cc): XLA's CPU and GPU compilers contract
# a*b + c into fused multiply-adds, which round once where the engine rounds twice, so a step
# may differ in the last bits of its update: at most HLO_ULPS units of the storage type's
# precision, relative to the larger of the old and new value (an update that cancels most
# of the value shows its own rounding magnified).
HLO_ULPS = 4


def assert_same(got, want, what, old=None):
    """Bit for bit (custom call); within HLO_ULPS for the HLO lowering."""
    exact = LOWERING == "custom_call"
    olds = [None] * (1 + len(got[1])) if old is None else [old[0]] + list(old[1])
    for k, (g, w, o) in enumerate(zip([got[0]] + got[1], [want[0]] + want[1], olds)):
        name = f"{what}: {'var' if k == 0 else 'slot %d' % k}"
        if exact:
            np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8),
                                          np.ascontiguousarray(w).view(np.uint8), err_msg=name)
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = np.maximum(np.abs(w64), np.abs(g64))
        if o is not None:
            scale = np.maximum(scale, np.abs(o.astype(np.float64)))
        eps = float(ml_dtypes.finfo(g.dtype).eps)  # numpy's and ml_dtypes' float types
        bad = np.abs(g64 - w64) > HLO_ULPS * eps * scale
        assert not bad.any(), (name, np.flatnonzero(bad)[:5], g.ravel()[bad.ravel()][:5],
                               w.ravel()[bad.ravel()][:5])


CASES = [(r, o, d) for r, o in harness.RULE_OPTIONS for d in DTYPES]


@pytest.mark.parametrize("rule,options,dtype", CASES, ids=harness.param_ids)
def test_dense_under_xla_equals_the_op(rule, options, dtype):
    case = make_case(rule, dtype, False, np.int32, seed=1)
    assert_same(run(rule, options, dtype, case, jit=True),
                run(rule, options, dtype, case, jit=False), "dense", old=case[:2])


def sparse_cases():
    """CASES with each index type. The HLO child (TF >= 2.16: the custom call's process runs
    the HLO lowering again in a child) takes one index type a case, alternating so that every
    rule and option set and every dtype still meets both: XLA compiles each case afresh there
    (about a second each), and the index type is one conversion ahead of the same update.
    Where the HLO lowering is the process's own (TF 2.15) every pair runs, as in the parent."""
    cases = []
    for k, (rule, options) in enumerate(harness.RULE_OPTIONS):
        for j, dtype in enumerate(DTYPES):
            for m, index_dtype in enumerate((np.int32, np.int64)):
                if CHILD and (j + k) % 2 != m:
                    continue
                cases.append(pytest.param(rule, options, dtype, index_dtype, id="-".join(
                    [rule, harness.param_ids(options), dtype, index_dtype.__name__])))
    return cases


@pytest.mark.parametrize("rule,options,dtype,index_dtype", sparse_cases())
def test_sparse_under_xla_equals_the_op(rule, options, dtype, index_dtype):
    case = make_case(rule, dtype, True, index_dtype, seed=2)
    got = run(rule, options, dtype, case, jit=True)
    assert_same(got, run(rule, options, dtype, case, jit=False), "sparse", old=case[:2])
    untouched = np.setdiff1d(np.arange(case[0].shape[0]), case[3])
    assert untouched.size > 0
    np.testing.assert_array_equal(got[0][untouched].view(np.uint8),
                                  case[0][untouched].view(np.uint8))


@pytest.mark.parametrize("dtype", ["float", "double", "bfloat16"])
def test_hot_rows_under_xla_equal_the_op(dtype):
    """Rows named 33, 1025 and 3000 times: the chunked summation order of sum_order.h."""
    rng = np.random.default_rng(3)
    ids = np.concatenate([np.full(c, r) for r, c in ((4, 33), (9, 1025), (17, 3000))] +
                         [rng.integers(0, 40, 200)])
    rng.shuffle(ids)
    case = make_case("lazy_adam", dtype, True, np.int64, seed=3, shape=(40, 5), ids=ids)
    assert_same(run("lazy_adam", {}, dtype, case, jit=True),
                run("lazy_adam", {}, dtype, case, jit=False), "hot rows", old=case[:2])


def test_empty_indices_and_empty_rows_are_no_ops():
    for shape, ids in (((6, 3), []), ((6, 0), [1, 1, 2])):
        case = make_case("adagrad", "float", True, np.int32, seed=4, shape=shape, ids=ids)
        got = run("adagrad", {}, "float", case, jit=True)
        assert_same(got, (case[0], case[1]), f"shape {shape}, ids {ids}")


@pytest.mark.parametrize("bad", [[3, -1, 2], [3, 50, 2], [2**31 - 1]])
def test_out_of_range_ids_write_nothing(bad):
    """custom_call: InvalidArgumentError naming the first offender, like the op. hlo: XLA
    cannot raise at run time; the whole update is dropped (all or nothing)."""
    case = make_case("lazy_adam", "float", True, np.int32, seed=5, ids=bad)
    variables = [tf.Variable(x) for x in [case[0]] + case[1]]
    fn = jit(lambda g, i: ops.resource_sparse_apply_lazy_adam(
        *variables, grad=g, indices=i, **case[4]))
    if LOWERING == "custom_call":
        first = next(p for p, v in enumerate(bad) if not 0 <= v < 50)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=re.escape(f"indices[{first}] = {bad[first]} is not in [0, 50)")):
            fn(tf.constant(case[2]), tf.constant(case[3]))
    else:
        fn(tf.constant(case[2]), tf.constant(case[3]))
    assert_same((variables[0].numpy(), [v.numpy() for v in variables[1:]]),
                (case[0], case[1]), "after out-of-range ids")


def test_shape_errors_are_the_ops_words():
    var, m, v = (tf.Variable(tf.zeros([4, 3])) for _ in range(3))
    fn = jit(lambda: ops.resource_sparse_apply_lazy_adam(
        var, m, v, 0.5, 0.5, 0.1, 0.9, 0.99, 1e-7, tf.ones([2, 4]), [0, 1]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=re.escape("grad must have shape [N] + var.shape[1:] = [2,3]")):
        fn()


def _same_variable_cases():
    v, w, m = (tf.Variable(tf.fill([4, 3], x)) for x in (1.0, 2.0, 3.0))
    return [v, w, m], {
        "dense": lambda: ops.resource_apply_adagrad(v, v, 0.1, 1e-7, tf.ones([4, 3])),
        "sparse": lambda: ops.resource_sparse_apply_adagrad(
            v, v, 0.1, 1e-7, tf.ones([2, 3]), [0, 1]),
        "slots": lambda: ops.resource_apply_lazy_adam(
            v, m, m, 0.5, 0.5, 0.1, 0.9, 0.99, 1e-7, tf.ones([4, 3])),
        "group": lambda: ops.resource_group_apply_adagrad(
            [v, w], [w, v], 0.1, 1e-7, [tf.ones([4, 3])] * 2),
    }


@pytest.mark.parametrize("case", ["dense", "sparse", "slots", "group"])
def test_a_variable_passed_twice_is_refused_and_unchanged(case):
    """Issue 30, item 2: under XLA one variable as var and slot (or two members of a group)
    was accepted and left var at the slot's value. Now the op's own error, at compile time,
    in both lowerings; every variable unchanged."""
    variables, calls = _same_variable_cases()
    before = [x.numpy().copy() for x in variables]
    with pytest.raises(tf.errors.InvalidArgumentError, match="are the same variable"):
        jit(calls[case])()
    for x, old in zip(variables, before):
        np.testing.assert_array_equal(x.numpy(), old)


def test_compiled_step_is_not_table_sized():
    """The compiled sparse step holds nothing of the table's size but the variables
    themselves: the table is updated in place (custom call with aliasing, or scatters)."""
    rows = 1_000_003  # a size that appears nowhere else
    variables = [tf.Variable(tf.zeros([rows, 8])) for _ in range(3)]
    fn = jit(lambda g, i: ops.resource_sparse_apply_lazy_adam(
        *variables, 0.5, 0.5, 0.1, 0.9, 0.99, 1e-7, grad=g, indices=i))
    args = (tf.ones([64, 8]), tf.range(64) * 3)
    fn(*args)
    hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    table = "[%d,8]" % rows
    opcodes = [op for shape, op in hlo_instructions(hlo) if table in shape]
    assert opcodes, hlo
    # In place: the custom call (aliased to the parameters) or scatters into them (TF 2.15's
    # XLA expands a scatter into a while loop of one-row dynamic-update-slices), and the
    # plumbing around them; never a copy, broadcast or element-wise pass over the table.
    allowed = {"parameter", "custom-call", "get-tuple-element", "tuple", "scatter", "bitcast",
               "while", "dynamic-update-slice"}
    fusions = [line for line in hlo.splitlines()
               if table + "{" in line.split(" fusion(")[0] and " fusion(" in line]
    for line in fusions:  # XLA wraps each scatter into a fusion: nothing else may be fused
        called = re.search(r"calls=(%[\w.\-]+)", line).group(1)
        body = re.search(r"\n" + re.escape(called) + r" [^\n]*\{\n(.*?)\n\}", hlo, re.S).group(1)
        assert re.search(r"ROOT \S+ = \S+ (scatter|dynamic-update-slice)\(", body), (line, body)
    if fusions:
        allowed.add("fusion")
    assert set(opcodes) <= allowed, (sorted(set(opcodes) - allowed), hlo)


def test_sparse_lowering_has_no_whole_length_window():
    """The run starts and ends of the sorted ids (HLO lowering) are running max/min scans in
    log2(n) doubling passes. A reduce-window of the ids' whole length, as before, is
    O(n^2) on XLA:CPU (200K ids: ~10 minutes per step on TF 2.15). Structural check of the
    compiled step: no reduce-window at all (the custom-call lowering has none either)."""
    var, accum = tf.Variable(tf.zeros([64, 8])), tf.Variable(tf.fill([64, 8], 0.1))
    fn = jit(lambda g, i: ops.resource_sparse_apply_adagrad(var, accum, 0.1, 1e-7, g, i))
    n = 5000
    args = (tf.ones([n, 8]), tf.range(n, dtype=tf.int64) % 64)
    fn(*args)
    hlo = fn.experimental_get_compiler_ir(*args)(stage="hlo")
    opcodes = {op for _, op in hlo_instructions(hlo)}
    assert "reduce-window" not in opcodes, sorted(opcodes)
    if LOWERING == "hlo":  # the doubling passes are there: ceil(log2 n) maxima and minima
        assert {"maximum", "minimum"} <= opcodes, sorted(opcodes)


def hlo_instructions(hlo):
    """(result shape, opcode) of every instruction in HLO text."""
    out = []
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%\S+ = ", line)
        if not m:
            continue
        rest = line[m.end():]
        if rest.startswith("("):  # a tuple shape: up to the matching parenthesis
            depth = 0
            for end, ch in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0:
                    break
            shape, rest = rest[:end + 1], rest[end + 1:]
        else:
            shape, _, rest = rest.partition(" ")
        out.append((shape, rest.strip().split("(")[0].split(" ")[0]))
    return out


@pytest.mark.slow
@pytest.mark.skipif(CHILD, reason="runs in the parent only")
def test_hlo_lowering_in_a_child_process():
    """The HLO lowering (XLA:GPU's, TF 2.15's) through this whole file."""
    if LOWERING == "hlo":
        pytest.skip("this process already uses the HLO lowering")
    env = dict(os.environ, FUSEDOPT_XLA_LOWERING="hlo", FUSEDOPT_TEST_XLA_CHILD="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"\d+ passed", out.stdout), out.stdout[-2000:]


LATE_LOAD = r"""
import tensorflow as tf
x = tf.Variable(tf.ones([4]))
tf.function(lambda: x.assign(x * 2), jit_compile=True)()   # the process's first XLA compilation
from fusedopt import ops                                     # the library loads after it
v, a = tf.Variable(tf.ones([5, 2])), tf.Variable(tf.fill([5, 2], 0.5))
f = tf.function(lambda: [ops.resource_sparse_apply_adagrad(v, a, 0.1, 0.0, tf.ones([2, 2]),
                                                          [1, 3]), None][1], jit_compile=True)
f()
print("ok", v.numpy()[:, 0].round(4).tolist())
"""


@pytest.mark.slow
def test_library_loaded_after_the_first_xla_compilation():
    out = subprocess.run([sys.executable, "-c", LATE_LOAD], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    want = [1.0, 1.0 - 0.1 / np.sqrt(1.5), 1.0, 1.0 - 0.1 / np.sqrt(1.5), 1.0]
    got = [float(x) for x in re.search(r"ok \[(.*)\]", out.stdout).group(1).split(",")]
    np.testing.assert_allclose(got, want, rtol=1e-4)
