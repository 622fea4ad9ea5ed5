"""The sparse scenario's anchors in plain TensorFlow: the benchmark's own composition of
every rule's lazy update in TF ops (tensorflow-addons style) and, where it is installed,
tensorflow-addons' LazyAdam itself. Each is checked against fusedopt's sparse op by the
benchmark's own machinery, on batches with repeated ids, at tiny sizes.

Not marked `once`: tensorflow-addons exists only with TensorFlow 2.15 (CI's second stage),
and the composition runs on each TensorFlow's ops."""
import numpy as np
import pytest

from fusedopt.bench.contenders import COMPOSED_TF_OPS, RULES


@pytest.fixture(scope="module")
def tf():
    import tensorflow

    return tensorflow


@pytest.fixture(scope="module")
def problem():
    from fusedopt.bench.sparse import Problem

    problem = Problem(rows=300, dim=8, ids=400, check_steps=1)
    for ids, _ in problem.batches:  # the timed (Zipf) batches: each repeats ids
        assert len(np.unique(ids)) < len(ids)
    assert len({len(np.unique(ids)) for ids, _ in problem.batches}) == 2  # rows touched differ
    return problem


def checked(contenders, oracles, name, problem):
    """check_and_time's row of `name` (beside fusedopt's op, the baseline), checked on the
    Zipf batches: repeated ids, which the sparse step must sum before updating."""
    from fusedopt.bench.timing import check_and_time

    pair = {"fusedopt (raw op)": contenders["fusedopt (raw op)"], name: contenders[name]}
    rows = check_and_time(pair, oracles, check_steps=3, steps=1, repeats=1,
                          progress=lambda message: None,
                          batches=(problem.batches, problem.batches))
    return rows[name]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_has_a_composed_contender_with_fusedopts_numbers(tf, problem, rule):
    # The scenario's own contenders (sparse.rule_contenders, whose list the quick run of
    # test_bench.py checks) without importing every peer library.
    from fusedopt.bench.sparse import SparseSteps

    steps = SparseSteps(tf, problem, rule)
    contenders = {"fusedopt (raw op)": (steps.fused, "lazy"),
                  COMPOSED_TF_OPS: (steps.composed, "lazy")}
    row = checked(contenders, {"lazy": steps.fused}, COMPOSED_TF_OPS, problem)
    assert row["match"] and row["max_rel_error"] < 1e-5, row
    # One trace for every step, though each batch touches a different number of rows.
    step, _ = steps.composed(problem.batches)
    for _ in range(4):
        step()
    assert step.function.experimental_get_tracing_count() == 1


def test_tensorflow_addons_lazy_adam_is_a_checked_contender_where_installed(tf, problem):
    from fusedopt.bench import libraries
    from fusedopt.bench.sparse import rule_contenders

    if libraries.tensorflow_addons() is None:
        pytest.skip("tensorflow-addons is not installed (it needs TensorFlow 2.15 or older)")
    contenders, oracles = rule_contenders(tf, problem, "lazy_adam")
    row = checked(contenders, oracles, "tensorflow_addons LazyAdam", problem)
    assert row["semantics"] == "lazy" and row["match"], row


@pytest.mark.parametrize("rule", ["lazy_adam", "row_wise_adagrad", "centered_rms_prop"])
def test_the_in_step_measure_runs_each_update_once_in_order(tf, problem, rule):
    # The floor aim times fused_in_step: its calls must be the very updates the one-update
    # step makes (same batches in turn, same step counts t), bit for bit, so that it times
    # the op's work and nothing less.
    from fusedopt.bench.sparse import SparseSteps

    steps = SparseSteps(tf, problem, rule)
    one, one_var = steps.fused(problem.batches)
    several, several_var = steps.fused_in_step(problem.batches, count=3)
    for _ in range(6):
        one()
    for _ in range(2):
        several()
    np.testing.assert_array_equal(several_var.numpy(), one_var.numpy())
    assert not np.array_equal(one_var.numpy(), problem.init)


def test_the_dense_in_step_measure_runs_each_update_once_in_order(tf):
    # The dense aim times DenseSteps.fused_in_step beside torch: its calls must make the
    # very updates of the one-update step (gradients in turn, same step counts), bit for bit.
    from fusedopt.bench.dense import DenseSteps

    rng = np.random.default_rng(7)
    init = rng.normal(0, 0.05, 5000).astype(np.float32)
    grads = [tf.constant(rng.normal(0, 1, 5000).astype(np.float32)) for _ in range(3)]
    steps = DenseSteps(tf, init, grads, "lazy_adam")
    one, one_var = steps.fused()
    several, several_var = steps.fused_in_step(count=4)
    for _ in range(8):
        one()
    for _ in range(2):
        several()
    np.testing.assert_array_equal(several_var.numpy(), one_var.numpy())
    one()  # one update more: no longer equal (the comparison can fail)
    assert not np.array_equal(one_var.numpy(), several_var.numpy())
