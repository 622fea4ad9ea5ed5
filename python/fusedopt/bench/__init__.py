"""``python -m fusedopt.bench``: fusedopt against what users would otherwise pick.

Every timing scenario runs all its contenders in this one process, interleaved (the order
rotates every repeat), several repeats, and reports the median step time, the spread
(min..max over repeats) and each contender's time as a multiple of fusedopt's. Before
timing, every contender runs the same steps from the same initial values and its
result is compared with fusedopt's op of the same semantics (lazy contenders with the
sparse op, dense-update contenders with the dense op on the densified gradient), so
the benchmark compares like with like. ``--quick`` shrinks every size (CI smoke run).

Runs (``cli``): the full run below, reported for users (no aims, peers that are not
installed named once); ``--aims`` adds the project's own targets (``aims``) to
results.json and the report, for its developers and CI; ``--headline`` (``headline``):
the sparse step, a dense step and each optimizer's state on one problem, at the user's
``--rows --dim --batch --optimizer``, in 2-3 minutes (``<out>/headline.json``);
``--largest-table ROWS...`` (``largest_table``): the largest table each optimizer trains on
this machine, every (optimizer, rows) point in a child process capped at the memory
available, so that a table that does not fit is an outcome, not a crash
(``<out>/largest_table.json``); ``--ps`` (``ps``): training on a parameter-server cluster of
processes on this machine, examples per second and the bytes on each parameter server
(``<out>/ps.json``).

Scenarios: sparse embedding step (every rule), the sparse step under XLA (jit_compile)
at two table sizes, dense step, scaling with touched rows and with table rows, achieved
memory bandwidth, many small variables. Three run apart, each contender in its own
process: ``sparse_fbgemm`` (FBGEMM's CPU TBE in its own venv, beside our sparse Adagrad
and row-wise Adagrad), ``state_memory`` (a 10M x 64 table's optimizer state and process
peak, one child per optimizer: ~14 GB of memory for Keras's Adam) and ``convergence``
(held-out loss of the row-wise rules against their full-state counterparts). Outputs: ``<out>/results.json``,
``<out>/benchmarks.png`` and the markdown report (``--markdown``, e.g. BENCHMARKS.md).

Modules: ``contenders`` (who runs, per rule: the one table to extend), ``sparse``,
``dense``, ``memory``, ``fbgemm_scenario``, ``state``, ``convergence`` (the scenarios), ``timing`` (checks and interleaved timing),
``aims``, ``report`` (markdown, plot), ``headline``, ``largest_table``, ``ps``, ``cli``
(flags, results.json), ``config``.
"""
from fusedopt.bench.cli import SCENARIOS, main
from fusedopt.bench.memory import huge_pages_available

__all__ = ["main", "SCENARIOS", "huge_pages_available"]
