"""The CPU engine's element loop is compiled twice, for the x86-64 baseline and for AVX2,
and picked at run time (cc/core/cpu_isa.h). Both must give the same bits for every rule,
option set, dtype, dense and sparse, in fusedopt._core and in the TF op library: the
AVX2 loop is only wider, never different (no FMA, no reordering)."""

import json
import os

import numpy as np
import pytest

import harness
from fusedopt import _core

ISA_SETTING = "FUSEDOPT_CPU_ISA"


def cpu_has_avx2():
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


def _special_values(a, rng):
    """A few values where lanes could disagree: NaN, infinities, signed zeros, subnormals,
    large numbers; elsewhere the usual draws. Positions differ per array."""
    flat = a.reshape(-1)
    picks = rng.choice(flat.size, size=min(8, flat.size), replace=False)
    tiny = np.finfo(np.float32).tiny / 4 if flat.dtype.itemsize >= 4 else 1e-6
    for position, value in zip(picks, [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny, 6e4]):
        flat[position] = value
    return a


def engine_results(rule, options, dtype, sparse, use_core=True):
    """{state name: bytes} after two steps of `rule` with `_core` (TF-free)."""
    rng = np.random.default_rng(41)
    shape = (67, 33)  # 2211 elements: not a multiple of any vector width (the scalar tail)
    var, slots = harness.make_state(rule, shape, dtype, rng)
    var = _special_values(var, rng)
    for t in (1, 2):
        hyper = harness.hyper_for(rule, dtype, t)
        if sparse:
            indices = harness.make_indices(90, shape[0], np.int64, rng)
            grad = _special_values(harness.make_grad((90, shape[1]), dtype, rng), rng)
            _core.apply_sparse(rule, var, slots, grad, indices, hyper, options, num_threads=2)
        else:
            grad = _special_values(harness.make_grad(shape, dtype, rng), rng)
            _core.apply_dense(rule, var, slots, grad, hyper, options, num_threads=2)
    return {name: a.tobytes().hex() for name, a in
            zip(["var"] + harness.RULES[rule]["slots"], [var] + slots)}


CASES = [(rule, options, dtype, sparse) for rule, options in harness.RULE_OPTIONS
         for dtype in harness.DTYPES for sparse in (False, True)]


def no_results():
    return {}


def all_engine_results():
    return {repr(case): engine_results(*case) for case in CASES}


def op_results():
    """{case: {state: bytes}} of the TF op library's dense, sparse and group ops."""
    import tensorflow as tf

    from fusedopt import ops

    out = {}
    for rule, options in harness.RULE_OPTIONS:
        for dtype in ("float", "double"):
            rng = np.random.default_rng(43)
            members = []
            for shape in [(67, 33), (5,), (1030,)]:
                var, slots = harness.make_state(rule, shape, dtype, rng)
                members.append([tf.Variable(_special_values(x, rng)) for x in [var] + slots])
            hyper = harness.hyper_for(rule, dtype, 1)
            names = ["var"] + harness.RULES[rule]["slots"]
            grads = [_special_values(harness.make_grad(m[0].shape, dtype, rng), rng)
                     for m in members]
            getattr(ops, "resource_apply_" + rule)(*members[0], grad=grads[0], **hyper,
                                                   **options)
            indices = harness.make_indices(40, 67, np.int32, rng)
            sparse_grad = _special_values(harness.make_grad((40, 33), dtype, rng), rng)
            getattr(ops, "resource_sparse_apply_" + rule)(*members[0], grad=sparse_grad,
                                                          indices=indices, **hyper, **options)
            getattr(ops, "resource_group_apply_" + rule)(
                *[[m[k] for m in members] for k in range(len(names))], grad=grads, **hyper,
                **options)
            out[repr((rule, options, dtype))] = [
                {name: v.numpy().tobytes().hex() for name, v in zip(names, m)}
                for m in members]
    return out


def _results_in_subprocess(function, isa_setting):
    code = ("import json, test_cpu_isa as t; from fusedopt import _core, ops; "
            "print('ISA', _core.cpu_isa(), ops.cpu_isa() if %r == 'op_results' else ''); "
            "print('RESULTS', json.dumps(t.%s()))" % (function, function))
    env = {ISA_SETTING: isa_setting} if isa_setting else {}
    proc = harness.run_python_in_subprocess(code, env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines()
             if line.startswith(("ISA ", "RESULTS "))}
    return lines["ISA"].split(), json.loads(lines["RESULTS"])


def _expected_isa():
    return "avx2" if cpu_has_avx2() else "baseline"


@pytest.mark.slow
def test_the_cpu_decides_and_the_setting_forces_the_baseline():
    env_isa = os.environ.get(ISA_SETTING)
    assert _core.cpu_isa() == ("baseline" if env_isa == "baseline" else _expected_isa())
    isa, _ = _results_in_subprocess("no_results", "baseline")
    assert isa == ["baseline"]


@pytest.mark.slow
def test_core_loops_bit_identical_across_isas():
    isa, baseline = _results_in_subprocess("all_engine_results", "baseline")
    assert isa == ["baseline"]
    assert _core.cpu_isa() == _expected_isa()
    here = all_engine_results()
    assert set(here) == set(baseline) and len(here) == len(CASES) > 0
    differing = [case for case in here if here[case] != baseline[case]]
    assert not differing, "results differ between %s and baseline: %s" % (
        _core.cpu_isa(), differing[:5])


@pytest.mark.slow
def test_op_library_loops_bit_identical_across_isas():
    pytest.importorskip("tensorflow")
    from fusedopt import ops

    assert ops.cpu_isa() == _expected_isa()
    isa, baseline = _results_in_subprocess("op_results", "baseline")
    assert isa == ["baseline", "baseline"]
    here = op_results()
    assert set(here) == set(baseline) and here
    differing = [case for case in here if here[case] != baseline[case]]
    assert not differing, "op results differ between %s and baseline: %s" % (
        ops.cpu_isa(), differing[:5])


@pytest.mark.slow
def test_info_names_the_loops_isa():
    proc = harness.run_python_in_subprocess("import fusedopt.info as i; i.main()")
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("cpu_vector_loops"))
    assert line.split()[1] == _expected_isa(), line
    proc = harness.run_python_in_subprocess("import fusedopt.info as i; i.main()",
                                            {ISA_SETTING: "baseline"})
    line = next(l for l in proc.stdout.splitlines() if l.startswith("cpu_vector_loops"))
    assert line.split()[1] == "baseline" and ISA_SETTING in line, line
