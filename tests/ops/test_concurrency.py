"""Concurrent updates of one variable.

With ``use_locking=True`` no update may be lost, whatever the interleaving: checked
with an order-independent invariant that holds exactly. Adagrad with lr = 0 leaves var
as it is and makes accum = accum0 + sum over calls of (that call's duplicate-summed
gradient row)^2; gradients are small integers, so every partial sum is an exactly
representable float32 integer and addition order cannot matter.

Dense and sparse updates (with duplicate indices) are mixed on the same variable, from
many Python threads (eager ops release the GIL), from concurrent calls of tf.functions,
and as independent ops of one graph run by a Session's inter-op pool (ref and resource
variables).  With ``use_locking=False`` updates may be lost, but nothing may crash and
var/accum keep their shape and dtype, with every element within [accum0, full sum].
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import fusedopt.ops as fops

ROWS, COLS = 96, 160  # 15k elements: the dense kernel is split across TF's threads
THREADS, STEPS = 8, 60


def plan(seed, n_calls):
    """n_calls updates: (kind, grad, indices) with small-integer gradients."""
    rng = np.random.default_rng(seed)
    calls = []
    for _ in range(n_calls):
        if rng.random() < 0.5:
            calls.append(("dense", rng.integers(-3, 4, (ROWS, COLS)).astype(np.float32), None))
        else:
            n = int(rng.integers(1, 24))
            idx = rng.integers(0, ROWS, n).astype(rng.choice([np.int32, np.int64]))
            calls.append(("sparse", rng.integers(-3, 4, (n, COLS)).astype(np.float32), idx))
    return calls


def contribution(calls):
    """Sum over calls of the squared (duplicate-summed) gradient rows, exactly (int64)."""
    total = np.zeros((ROWS, COLS), np.int64)
    for kind, g, idx in calls:
        g = g.astype(np.int64)
        if kind == "dense":
            total += g * g
        else:
            summed = np.zeros_like(total)
            np.add.at(summed, idx.astype(np.int64), g)
            touched = np.unique(idx)
            total[touched] += summed[touched] ** 2
    return total


def initial():
    rng = np.random.default_rng(123)
    var0 = rng.uniform(-1, 1, (ROWS, COLS)).astype(np.float32)
    accum0 = rng.integers(1, 5, (ROWS, COLS)).astype(np.float32)
    return var0, accum0


def apply_eager(var, accum, call, use_locking):
    kind, g, idx = call
    if kind == "dense":
        fops.resource_apply_adagrad(var, accum, 0.0, 0.1, g, use_locking=use_locking)
    else:
        fops.resource_sparse_apply_adagrad(var, accum, 0.0, 0.1, g, idx,
                                           use_locking=use_locking)


def run_threads(worker, n):
    errors = []

    def wrap(i):
        try:
            worker(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def check(var, accum, var0, accum0, all_calls, exact):
    assert var.shape == (ROWS, COLS) and var.dtype == np.float32
    assert accum.shape == (ROWS, COLS) and accum.dtype == np.float32
    assert var.tobytes() == var0.tobytes(), "lr = 0 must leave var unchanged"
    full = accum0.astype(np.int64) + contribution(all_calls)
    assert full.max() < 2**24  # every partial sum is exact in float32
    if exact:
        np.testing.assert_array_equal(accum, full.astype(np.float32))
    else:
        assert np.all(accum >= accum0) and np.all(accum <= full)
        assert np.all(accum == np.round(accum)), "torn/garbage values"


@pytest.mark.parametrize("use_locking", [True, False])
def test_eager_threads(use_locking):
    var0, accum0 = initial()
    var, accum = tf.Variable(var0), tf.Variable(accum0)
    plans = [plan(i, STEPS) for i in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def worker(i):
        barrier.wait()
        for call in plans[i]:
            apply_eager(var, accum, call, use_locking)

    run_threads(worker, THREADS)
    check(var.numpy(), accum.numpy(), var0, accum0, sum(plans, []), exact=use_locking)


@pytest.mark.parametrize("use_locking", [True, False])
def test_concurrent_tf_functions(use_locking):
    """Several tf.functions, each doing a dense and a sparse update, called concurrently."""
    var0, accum0 = initial()
    var, accum = tf.Variable(var0), tf.Variable(accum0)

    @tf.function
    def dense_then_sparse(g, sg, idx):
        fops.resource_apply_adagrad(var, accum, 0.0, 0.1, g, use_locking=use_locking)
        fops.resource_sparse_apply_adagrad(var, accum, 0.0, 0.1, sg, idx,
                                           use_locking=use_locking)

    @tf.function
    def sparse_only(sg, idx):
        fops.resource_sparse_apply_adagrad(var, accum, 0.0, 0.1, sg, idx,
                                           use_locking=use_locking)

    plans = []
    for i in range(THREADS):
        rng = np.random.default_rng(1000 + i)
        p = []
        for _ in range(STEPS // 2):
            n = 16  # fixed shapes: one trace per function
            idx = rng.integers(0, ROWS, n).astype(np.int64)
            sg = rng.integers(-3, 4, (n, COLS)).astype(np.float32)
            if i % 2 == 0:
                g = rng.integers(-3, 4, (ROWS, COLS)).astype(np.float32)
                p.append((("dense", g, None), ("sparse", sg, idx)))
            else:
                p.append((("sparse", sg, idx),))
        plans.append(p)
    # Trace both before the threads start (tracing is not what is under test).
    zero_g = np.zeros((ROWS, COLS), np.float32)
    dense_then_sparse(zero_g, np.zeros((16, COLS), np.float32), np.zeros(16, np.int64))
    sparse_only(np.zeros((16, COLS), np.float32), np.zeros(16, np.int64))
    barrier = threading.Barrier(THREADS)

    def worker(i):
        barrier.wait()
        for step in plans[i]:
            if len(step) == 2:
                dense_then_sparse(step[0][1], step[1][1], step[1][2])
            else:
                sparse_only(step[0][1], step[0][2])

    run_threads(worker, THREADS)
    calls = [c for p in plans for step in p for c in step]
    check(var.numpy(), accum.numpy(), var0, accum0, calls, exact=use_locking)


@pytest.mark.parametrize("use_locking", [True, False])
@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_graph_independent_ops(resource, use_locking):
    """Many update ops with no dependencies between them in one Session.run: TF runs them
    concurrently on its inter-op pool."""
    var0, accum0 = initial()
    calls = plan(7, 32)
    with tf.Graph().as_default():
        var = tf.compat.v1.Variable(var0, use_resource=resource)
        accum = tf.compat.v1.Variable(accum0, use_resource=resource)
        ops = []
        for kind, g, idx in calls:
            if kind == "dense":
                f = fops.resource_apply_adagrad if resource else fops.apply_adagrad
                op = f(var, accum, 0.0, 0.1, tf.constant(g), use_locking=use_locking)
            else:
                f = (fops.resource_sparse_apply_adagrad if resource
                     else fops.sparse_apply_adagrad)
                op = f(var, accum, 0.0, 0.1, tf.constant(g), tf.constant(idx),
                       use_locking=use_locking)
            ops.append(op if isinstance(op, tf.Operation) else op.op)
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            rounds = 5
            for _ in range(rounds):
                sess.run(ops)
            v, a = sess.run([var, accum])
    check(v, a, var0, accum0, calls * rounds, exact=use_locking)


@pytest.mark.parametrize("rule", ["AdagradOptimizer", "RMSPropOptimizer"])
def test_compat_v1_apply_gradients_from_threads_loses_nothing(rule):
    """Issue 30, item 3: one fusedopt.compat.v1 optimizer, eager apply_gradients from 8
    threads at once, each on variables of its own. The dense updates an apply_gradients
    call collects for the group op are that call's own: every thread's variables end
    exactly where the same steps run alone put them (no update lost or applied twice, no
    AttributeError, no spurious 'same variable' error)."""
    import sys
    import traceback

    import fusedopt.compat.v1 as fv1

    make = getattr(fv1, rule)
    steps, threads = 15, 8
    rng = np.random.default_rng(7)
    grads = [[rng.integers(-3, 4, (4, 5)).astype(np.float32) for _ in range(steps)]
             for _ in range(threads)]

    def variables():
        return [[tf.Variable(tf.ones([4, 5])), tf.Variable(tf.ones([4, 5]))]
                for _ in range(threads)]

    def step(optimizer, pair, g):
        optimizer.apply_gradients([(tf.constant(g), pair[0]), (tf.constant(-g), pair[1])])

    def warm_up(optimizer, pairs):
        # Slots first, from one thread: slot creation is not for threads (as in TF's own).
        optimizer.apply_gradients([(tf.zeros([4, 5]), v) for pair in pairs for v in pair])

    want, alone = variables(), make(0.1)
    warm_up(alone, want)
    for t in range(threads):
        for g in grads[t]:
            step(alone, want[t], g)

    got, shared = variables(), make(0.1)
    warm_up(shared, got)
    barrier = threading.Barrier(threads)
    errors = []

    def worker(t):
        barrier.wait()
        try:
            for g in grads[t]:
                step(shared, got[t], g)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(traceback.format_exc())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        run_threads(worker, threads)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    for t in range(threads):
        for a, b in zip(got[t], want[t]):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg="thread %d" % t)
