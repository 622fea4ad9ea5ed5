"""No leaks: 20k steps of every op (dense on a small variable, sparse with duplicate ids)
keep the process RSS flat. RSS is measured after a warm-up (caches, thread pools,
allocator pools) and may grow by at most GROWTH_MB over the measured steps.

Also the pybind11 module (fusedopt._core) and rejected calls (error paths allocate the
message and must free everything).  FUSEDOPT_LEAK_STEPS overrides the step count.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from fusedopt import _core
import fusedopt.ops as fops
import harness

RULES = harness.RULES
STEPS = int(os.environ.get("FUSEDOPT_LEAK_STEPS", "20000"))
WARMUP = max(1, STEPS // 10)
GROWTH_MB = 20

# What leaks would be our kernels' and pybind module's own allocations, the same source under
# every TensorFlow: one TF stage of CI runs these (tools/test_all.sh).
pytestmark = pytest.mark.once


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def assert_flat(step, what, limit=GROWTH_MB):
    """Runs step(i) WARMUP times, measures, runs it STEPS times, measures again."""
    for i in range(WARMUP):
        step(i)
    before = rss_mb()
    for i in range(STEPS):
        step(i)
    growth = rss_mb() - before
    print("\nRSS %s: %.1f MB after %d warm-up steps, %+.2f MB over %d steps"
          % (what, before, WARMUP, growth, STEPS))
    assert limit is None or growth < limit, "%s: RSS grew by %.1f MB over %d steps" % (what, growth, STEPS)
    return growth


def _state(rule, shape, rng):
    var, slots = harness.make_state(rule, shape, "float", rng)
    return var, slots


def _hyper(rule):
    return harness.hyper_for(rule, "float", 1)


@pytest.mark.slow
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_resource_eager(rule, sparse):
    rng = np.random.default_rng(0)
    var, slots = _state(rule, (50, 8), rng)
    vs = [tf.Variable(x) for x in [var] + slots]
    h = _hyper(rule)
    hyper = [tf.constant(h[n], tf.float32) for n in RULES[rule]["hyper"]]
    idx = tf.constant([3, 7, 3, 49, 0], tf.int64)
    grad = tf.constant(harness.make_grad((5, 8) if sparse else (50, 8), "float", rng) * 1e-3)
    f = getattr(fops, "resource_%sapply_%s" % ("sparse_" if sparse else "", rule))
    args = vs + hyper + [grad] + ([idx] if sparse else [])
    assert_flat(lambda i: f(*args), "%s %s eager" % (rule, sparse))
    assert all(np.isfinite(v.numpy()).all() for v in vs)


def test_member_packs():
    """Packs made and dropped (each holds its members' Vars; the last handle frees it),
    and steps of the packed group op."""
    rng = np.random.default_rng(0)
    var, slots = _state("lazy_adam", (64, 16), rng)
    vs = [tf.Variable(x) for x in [var] + slots]
    from fusedopt import _pack_registry
    alive = len(_pack_registry._handles)  # packs other tests' optimizers still hold
    assert_flat(lambda i: fops.variable_pack(vs), "member pack made and dropped")
    assert len(_pack_registry._handles) <= alive + 1  # the registry forgets dropped packs
    pack = fops.variable_pack(vs)
    h = _hyper("lazy_adam")
    hyper = {n: tf.constant(h[n], tf.float32) for n in RULES["lazy_adam"]["hyper"]}
    grad = [tf.constant(harness.make_grad((64, 16), "float", rng) * 1e-3)]
    assert_flat(lambda i: fops.resource_packed_group_apply_lazy_adam(pack, grad=grad, **hyper),
                "packed group op eager")
    assert all(np.isfinite(v.numpy()).all() for v in vs)


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(RULES))
def test_ref_graph(rule):
    """Ref ops (dense and sparse, in one run call) from a Session, STEPS runs."""
    rng = np.random.default_rng(1)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var, slots = _state(rule, (50, 8), rng)
        vs = [tf.compat.v1.Variable(x, use_resource=False) for x in [var] + slots]
        var2, slots2 = _state(rule, (50, 8), rng)
        vs2 = [tf.compat.v1.Variable(x, use_resource=False) for x in [var2] + slots2]
        h = _hyper(rule)
        hyper = [tf.constant(h[n], tf.float32) for n in RULES[rule]["hyper"]]
        g = tf.constant(harness.make_grad((50, 8), "float", rng) * 1e-3)
        sg = tf.constant(harness.make_grad((5, 8), "float", rng) * 1e-3)
        idx = tf.constant([3, 7, 3, 49, 0], tf.int32)
        dense = getattr(fops, "apply_%s" % rule)(*vs, *hyper, g)
        sparse = getattr(fops, "sparse_apply_%s" % rule)(*vs2, *hyper, sg, idx)
        train = tf.group(dense, sparse)
        sess.run(tf.compat.v1.global_variables_initializer())
        assert_flat(lambda i: sess.run(train), "%s ref graph" % rule)


def test_rejected_calls():
    """Error paths (bad index, bad shape) allocate messages: nothing may accumulate.

    TensorFlow's eager error path itself keeps ~0.6 KB per raised InvalidArgumentError
    (TF's own ResourceSparseApplyAdagradV2 does the same), so the bound is relative to
    TF's native ops rejecting the same inputs."""
    var = tf.Variable(np.zeros((10, 4), np.float32))
    accum = tf.Variable(np.ones((10, 4), np.float32))
    g = tf.constant(np.ones((3, 4), np.float32))
    bad_idx = tf.constant([1, 2, 99], tf.int32)
    bad_dense = tf.constant(np.ones((10, 5), np.float32))
    lr, eps = tf.constant(0.1), tf.constant(0.1)

    def ours(i):
        if i % 2:
            fops.resource_sparse_apply_adagrad(var, accum, lr, eps, g, bad_idx)
        else:
            fops.resource_apply_adagrad(var, accum, lr, eps, bad_dense)

    def native(i):
        if i % 2:
            tf.raw_ops.ResourceSparseApplyAdagradV2(var=var.handle, accum=accum.handle, lr=lr,
                                                    epsilon=eps, grad=g, indices=bad_idx)
        else:
            tf.raw_ops.ResourceApplyAdagradV2(var=var.handle, accum=accum.handle, lr=lr,
                                              epsilon=eps, grad=bad_dense)

    def rejecting(f):
        def step(i):
            try:
                f(i)
            except tf.errors.InvalidArgumentError:
                return
            raise AssertionError("bad call accepted")
        return step

    tf_growth = assert_flat(rejecting(native), "TF's native ops, rejected calls", limit=None)
    our_growth = assert_flat(rejecting(ours), "fusedopt ops, rejected calls", limit=None)
    # TF's own eager error path keeps ~0.5-0.7 KB per raised error (measured alike for
    # TF's native op and ours, 546-664 B/call); the engine's error path keeps nothing
    # (test_core_rejected_calls_keep_nothing). Ours must stay within the step bound.
    assert our_growth < GROWTH_MB, (our_growth, tf_growth)
    assert (accum.numpy() == 1).all() and (var.numpy() == 0).all()


def test_core_rejected_calls_keep_nothing():
    """Without TensorFlow's error machinery in the way, a rejected call (validated and
    refused by the same engine code the ops use) leaves no memory behind at all."""
    var = np.zeros((100, 8), np.float32)
    slots = [np.zeros_like(var), np.zeros_like(var)]
    g = np.ones((3, 8), np.float32)
    bad = np.array([1, 200, 3], np.int64)
    hyper = _hyper("lazy_adam")

    def step(i):
        try:
            _core.apply_sparse("lazy_adam", var, slots, g, bad, hyper, {})
        except ValueError:
            return
        raise AssertionError("bad call accepted")
    assert_flat(step, "_core rejected calls", limit=1.0)  # measured: +0.00 MB per 50k
    assert not var.any() and not slots[0].any() and not slots[1].any()


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(RULES))
def test_core_module(rule):
    rng = np.random.default_rng(2)
    var, slots = _state(rule, (50, 8), rng)
    hyper = _hyper(rule)
    g = harness.make_grad((50, 8), "float", rng) * 1e-3
    sg = harness.make_grad((5, 8), "float", rng) * 1e-3
    idx = np.array([3, 7, 3, 49, 0], np.int64)
    bad = np.array([3, 50], np.int64)

    def step(i):
        _core.apply_dense(rule, var, slots, g, hyper, {}, num_threads=2)
        _core.apply_sparse(rule, var, slots, sg, idx, hyper, {}, num_threads=2)
        if i % 16 == 0:
            with pytest.raises(ValueError):
                _core.apply_sparse(rule, var, slots, sg[:2], bad, hyper, {})

    assert_flat(step, "%s _core" % rule)
