"""The benchmark's fixed settings: threads, hyper-parameters and problem sizes."""

THREADS = 2  # TF intra-op, torch and fusedopt._core: the same for every contender
BETA1, BETA2, EPS, LR = 0.9, 0.999, 1e-7, 1e-3


def sizes(quick):
    """Problem sizes and step counts; `quick`: tiny ones, for the CI smoke run."""
    if quick:
        return dict(rows=2000, dim=8, ids=300, check_steps=3, steps=3, repeats=2,
                    dense_params=4096, dense_steps=3, bandwidth_params=1 << 16,
                    touched=[16, 64], tables=[1000, 4000],
                    scaling_table=4000, scaling_ids=64, scaling_steps=3,
                    small_pairs=10, small_dim=8, small_steps=2, small_loop_steps=3, dense_sizes=[4096, 16384], xla_tables=[500, 2000],
                    fbgemm_tables=[2000, 500], fbgemm_threads=[1, 2])
    return dict(rows=1_000_000, dim=64, ids=16_384, check_steps=3, steps=20, repeats=5,
                dense_params=16 * 2**20, dense_steps=10, bandwidth_params=1 << 27,
                touched=[1024, 4096, 16384, 65536, 262144],
                tables=[100_000, 1_000_000, 10_000_000],
                scaling_table=1_000_000, scaling_ids=100_000, scaling_steps=20,
                small_pairs=500, small_dim=64, small_steps=10, small_loop_steps=10,
                dense_sizes=[16 * 2**20, 128 * 2**20],
                xla_tables=[10_000, 1_000_000],
                fbgemm_tables=[1_000_000, 10_000], fbgemm_threads=[1, 2])


def embedding_sizes(quick):
    """Sizes of the embedding-scale scenarios (state_memory, convergence)."""
    if quick:
        return dict(state=dict(rows=200_000, dim=64, ids=2048, warmup=2, steps=3),
                    convergence=dict(rows=5_000, dim=8, features=4, hidden=16, batch=256,
                                     steps=200, evals=2, held_out=8_192))
    return dict(state=dict(rows=10_000_000, dim=64, ids=16_384, warmup=2, steps=30),
                convergence=dict(rows=200_000, dim=16, features=4, hidden=32, batch=1024,
                                 steps=10_000, evals=5, held_out=65_536))


def largest_table_sizes(quick):
    """The --largest-table sweep's table width, ids per step and steps (its rows are the
    command line's): up to `steps` timed steps, at least `min_steps`, stopping after
    `budget_s` (Keras's dense Adam takes seconds a step on the large tables)."""
    if quick:
        return dict(dim=8, batch=300, warmup=1, steps=2, min_steps=2, budget_s=10.0,
                    huge_pages_wait_s=5.0, timeout_s=300.0)
    return dict(dim=32, batch=16_384, warmup=2, steps=20, min_steps=3, budget_s=20.0,
                huge_pages_wait_s=120.0, timeout_s=1800.0)
