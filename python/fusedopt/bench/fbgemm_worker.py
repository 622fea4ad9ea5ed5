"""FBGEMM's CPU training TBE as a peer and test oracle, run in FBGEMM's own venv.

TF-free and fusedopt-free: TensorFlow 2.21 and the torch fbgemm-gpu-cpu 1.9.0 needs (2.14)
crash when imported into one process, so this script runs as a child process with the
interpreter of ``tools/setup_fbgemm_env.sh``'s venv, in isolated mode (``python -I``: the
bench folder, with its config.py and timing.py, stays off sys.path):

    python -I fbgemm_worker.py REQUEST.npz RESULT.npz

REQUEST.npz holds arrays, plus ``request``: a JSON string ``{"jobs": [job, ...]}``. A job:

    optimizer   "EXACT_ROWWISE_ADAGRAD" or "EXACT_ADAGRAD"
    lr, eps     hyper-parameters (float32, as FBGEMM keeps them)
    table       key of the (rows, D) float32 initial table
    state       key of the initial accumulator ((rows,) row-wise, (rows, D) element-wise),
                or ``state_init``: one value for every entry
    batches     [[ids key, grads key], ...]: step t uses batch t % len; the ids (int64, one
                per bag) and their gradient rows (len(ids), D) float32
    steps       number of steps
    threads     torch.set_num_threads (FBGEMM's CPU kernels run on ATen's parallel_for)
    mode        "apply": run the steps; RESULT gets ``job<i>_table_<t>`` and
                ``job<i>_state_<t>`` after every step t = 1..steps
                "update": time the backward alone (the fused gradient + optimizer step);
                each step's forward runs untimed before it
                "lookup_update": time forward + backward
    repeats     timing modes: one warm-up step, then `repeats` runs of `steps` steps

RESULT.npz: the arrays above and ``result``, a JSON string ``{"versions": {...}, "jobs":
[{"seconds_per_step": [one per repeat]} or {}, ...]}``.

How FBGEMM feeds our per-id gradients: a SUM-pooled lookup with one id per bag (offsets
0, 1, ..., n), so bag b's output gradient is exactly the gradient row of id b.

What FBGEMM computes there (read from pytorch/FBGEMM: fbgemm_gpu/codegen/training/backward/
embedding_backward_split_cpu_template.cpp, codegen/genscript/optimizers.py, src/
SparseAdagrad.cc and its reference rowwise_sparse_adagrad_ref in src/RefImplementations.cc),
everything in float32, no double accumulation (at::acc_type<float, /*is_cuda=*/true> is float):

- Duplicate ids: csr2csc groups the bags by id with a stable radix sort, so each table row
  sums its gradient rows in order of appearance, left to right, in float32 (fbgemm's
  SpMDM kernel for row-wise, a plain loop for Adagrad), before one update per row: as
  fusedopt does for up to 32 duplicates (cc/core/sum_order.h; more: two levels of chunks).
- EXACT_ROWWISE_ADAGRAD (float weights and gradients, one table: fbgemm's JIT kernel
  GenerateSparseAdaGrad(D, rowwise=true), parallel over rows in blocks of 64):
    sum   = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)),
            l_j = sum of g[d]^2 over d = j, j+8, j+16, ... (AVX2 lanes; vmulps then vaddps,
            no FMA; two vhaddps, then the two halves added)
    h    += sum / D                 (divss: a true division by float(D))
    step  = (-lr) / (sqrt(h) + eps) (sqrtss, then vaddps, vdivps: eps outside the sqrt)
    w     = step * g + w            (= w - (lr / (sqrt(h) + eps)) * g exactly)
  D == 1 takes SparseAdaGradBlockSize1_: h += g*g; w += (-lr) / (sqrt(h) + eps) * g.
  The learning rate is a float32 tensor (learning_rate_tensor.item<float>()), eps a float.
  fusedopt's row_wise_adagrad has the same operations; only the order of the D squares
  differs (cc/core/row_sum.h: 32 lanes folded in halves), so accumulators may differ in
  the last bits and the table by as much of the step (tests/core/test_fbgemm_oracle.py).
- EXACT_ADAGRAD (a plain loop over rows, one thread; optimizers.py's CPU update):
    h[d] += g[d] * g[d];  w[d] -= lr * g[d] / (sqrt(h[d]) + eps)
  = TF's ApplyAdagradV2 and fusedopt's adagrad with epsilon outside the sqrt (its default
  options; Keras's epsilon_inside_sqrt form is a different update). The float evaluation
  differs: 1.9.0's build returns, bit for bit, h = fma(g, g, h) (one rounding: the compiler
  contracted it) and w = float(double(w) - double(lr * g) / (sqrt(double(h)) + eps)) (the
  sqrt() of a float promoted to double); fusedopt rounds each operation to float.
"""
import json
import sys
import time


def _fbgemm():
    """(torch, numpy, the TBE class and its enums), imported on first use."""
    import numpy as np
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (EmbeddingLocation,
                                                                       PoolingMode)
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

    return dict(np=np, torch=torch, EmbOptimType=EmbOptimType, SparseType=SparseType,
                EmbeddingLocation=EmbeddingLocation, PoolingMode=PoolingMode,
                ComputeDevice=ComputeDevice, TBE=SplitTableBatchedEmbeddingBagsCodegen)


def versions():
    import fbgemm_gpu
    import torch

    return {"fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?"), "torch": torch.__version__,
            "python": sys.version.split()[0]}


def _any_dim():
    """A context in which the TBE takes any D: its Python constructor asserts D % 4 == 0
    (construct_split_state; the GPU kernels load rows 4 floats at a time), its CPU kernels
    do not need it (fbgemm's JIT kernels mask the tail of a row, D == 1 has its own
    kernel). Sized for 4 * D per row instead: one table starts at offset 0 either way, and
    the TBE views its buffers with the real D."""
    import contextlib

    import fbgemm_gpu.split_table_batched_embeddings_ops_training as training

    original = training.construct_split_state

    def padded(embedding_specs, *args, **kwargs):
        specs = [(rows, 4 * dim, *rest) for rows, dim, *rest in embedding_specs]
        return original(specs, *args, **kwargs)

    @contextlib.contextmanager
    def patched():
        training.construct_split_state = padded
        try:
            yield
        finally:
            training.construct_split_state = original
    return patched()


def make_tbe(m, job, table, state):
    """One HOST/CPU table holding `table` and accumulator `state` (fp32 weights and output,
    SUM pooling)."""
    import contextlib

    rows, dim = table.shape
    if dim % 4 and not job.get("any_dim"):
        raise ValueError(f"FBGEMM's TBE needs D % 4 == 0 (D = {dim}); any_dim: run its CPU "
                         "kernels all the same")
    with _any_dim() if dim % 4 else contextlib.nullcontext():
        tbe = _new_tbe(m, job, rows, dim)
    torch = m["torch"]
    with torch.no_grad():
        tbe.split_embedding_weights()[0].copy_(torch.from_numpy(table))
        momentum = tbe.split_optimizer_states()[0][0]
        if state is None:
            momentum.fill_(job["state_init"])
        else:
            momentum.copy_(torch.from_numpy(state).reshape(momentum.shape))
    return tbe


def _new_tbe(m, job, rows, dim):
    return m["TBE"](
        embedding_specs=[(rows, dim, m["EmbeddingLocation"].HOST, m["ComputeDevice"].CPU)],
        optimizer=getattr(m["EmbOptimType"], job["optimizer"]),
        learning_rate=job["lr"], eps=job["eps"],
        weights_precision=m["SparseType"].FP32, output_dtype=m["SparseType"].FP32,
        pooling_mode=m["PoolingMode"].SUM)


def torch_batches(m, arrays, job):
    """[(ids, offsets, grad)] as torch tensors: one id per bag."""
    torch = m["torch"]
    out = []
    for ids_key, grads_key in job["batches"]:
        ids = torch.from_numpy(arrays[ids_key].astype("int64"))
        offsets = torch.arange(ids.numel() + 1, dtype=torch.int64)
        out.append((ids, offsets, torch.from_numpy(arrays[grads_key])))
    return out


def step(tbe, batch, timed_forward):
    """One lookup + update; returns the seconds of what is timed (forward + backward, or
    the backward alone)."""
    ids, offsets, grad = batch
    start = time.perf_counter()
    out = tbe(ids, offsets)
    if not timed_forward:
        start = time.perf_counter()
    out.backward(grad)
    return time.perf_counter() - start


def run_job(m, arrays, job, index, results):
    torch = m["torch"]
    torch.set_num_threads(int(job.get("threads", 1)))
    state = arrays[job["state"]] if "state" in job else None
    tbe = make_tbe(m, job, arrays[job["table"]], state)
    batches = torch_batches(m, arrays, job)
    steps = int(job["steps"])
    if job["mode"] == "apply":
        for t in range(steps):
            step(tbe, batches[t % len(batches)], True)
            with torch.no_grad():
                results[f"job{index}_table_{t + 1}"] = tbe.split_embedding_weights()[0].numpy().copy()
                results[f"job{index}_state_{t + 1}"] = \
                    tbe.split_optimizer_states()[0][0].numpy().copy()
        return {}
    timed_forward = {"update": False, "lookup_update": True}[job["mode"]]
    step(tbe, batches[0], timed_forward)  # warm-up: first-call allocations and JIT kernels
    per_repeat = []
    for _ in range(int(job["repeats"])):
        seconds = sum(step(tbe, batches[t % len(batches)], timed_forward) for t in range(steps))
        per_repeat.append(seconds / steps)
    return {"seconds_per_step": per_repeat}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    m = _fbgemm()
    np = m["np"]
    with np.load(argv[1], allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    request = json.loads(str(arrays.pop("request")))
    results = {}
    jobs = [run_job(m, arrays, job, i, results) for i, job in enumerate(request["jobs"])]
    results["result"] = np.array(json.dumps({"versions": versions(), "jobs": jobs}))
    np.savez(argv[2], **results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
