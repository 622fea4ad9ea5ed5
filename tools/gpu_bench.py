"""Bandwidth of fusedopt's CUDA kernels (fusedopt._core_cuda) on the GPU it runs on,
against a device-to-device copy measured in the same run. No TensorFlow needed.

    python tools/gpu_bench.py [--out DIR] [--elements N] [--repeats R]

Dense: every rule, float32 and bfloat16, N elements as rows of 64 (a per-row slot holds
one value per row); bytes counted = what one fused pass must move (read var, slots, grad;
write var, slots). Sparse: LazyAdam, Adagrad and row-wise Adagrad, float32, on a
1M x 64 table, ids Zipf-distributed (hot rows: the hottest takes ~1/3 of a batch) or
uniform; duplicates coalesced on the device; bytes = gradient rows read + touched rows
of var and slots read and written. `wait` = the call checks its indices' verdict before
returning (a host sync per call); `no wait` = apply_sparse(wait=False), calls back to back
as a training loop runs them. Peer, where PyTorch is installed, side by side on the same
device: torch.optim.SparseAdam (lazy Adam on sparse gradients: the same update) on the
same table and ids, and torch.optim.Adam(fused=True) for the dense float32 LazyAdam case.
Many small (the group op's case): LazyAdam float32 over 500 x [64, 64] + 500 x [64]
variables, as one apply_dense_group call (multi-tensor launches) and as 1,000 apply_dense
calls, with torch.optim.Adam(fused=True) and (foreach=True) on the same shapes.
Time: CUDA events around `repeats` back-to-back calls, best of 3 (peers: the same, with
torch's events on torch's stream). Writes gpu_bench.json and gpu_bench.md to --out
(default: $OUT when set).
"""
import argparse
import json
import os
import sys

import numpy as np

BUILD = os.environ.get("FUSEDOPT_GPU_BUILD")
if BUILD:
    sys.path.insert(0, BUILD)
try:
    import _core_cuda as core_cuda
except ImportError:
    from fusedopt import _core_cuda as core_cuda
import cupy as cp

try:
    import torch
except ImportError:  # the peers are optional
    torch = None

# Every rule of the registry, with hyper-parameter values by name (0.5 for a name not
# listed: any value serves a bandwidth measurement).
RULES = core_cuda.rules()
SLOTS = {rule: len(spec["slots"]) for rule, spec in RULES.items()}
# Per rule, each slot's layout: True where it holds one value per row of var.
PER_ROW = {rule: [spec["slot_layouts"][name] == "per_row" for name in spec["slots"]]
           for rule, spec in RULES.items()}
# The rules of the sparse table benchmark: LazyAdam (torch's SparseAdam is its peer), and
# full and row-wise Adagrad side by side (the state an embedding table keeps).
SPARSE_RULES = ("lazy_adam", "adagrad", "row_wise_adagrad")
VALUES = dict(beta1_power=0.9**3, beta2_power=0.999**3, lr=1e-3, beta1=0.9, beta2=0.999,
              epsilon=1e-7, rho=0.9, momentum=0.9)
HYPER = {rule: {h: VALUES.get(h, 0.5) for h in spec["hyper"]} for rule, spec in RULES.items()}


def timed(fn, repeats):
    """Best-of-3 milliseconds per call of fn()."""
    fn()
    cp.cuda.runtime.deviceSynchronize()
    best = float("inf")
    for _ in range(3):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / repeats)
    return best


def timed_torch(fn, repeats):
    """timed() for work on torch's current stream."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop) / repeats)
    return best


def torch_dense_adam_ms(n, repeats):
    param = torch.zeros(n, device="cuda", requires_grad=True)
    param.grad = torch.ones(n, device="cuda")
    opt = torch.optim.Adam([param], lr=1e-3, eps=1e-7, fused=True)
    ms = timed_torch(opt.step, repeats)
    del opt, param
    torch.cuda.empty_cache()
    return ms


def torch_sparse_adam_ms(rows, width, ids, repeats):
    table = torch.zeros(rows, width, device="cuda", requires_grad=True)
    index = torch.as_tensor(ids, device="cuda")[None]
    values = torch.ones(ids.size, width, device="cuda")
    opt = torch.optim.SparseAdam([table], lr=1e-3, eps=1e-7)

    def step():
        table.grad = torch.sparse_coo_tensor(index, values, (rows, width))
        opt.step()
    ms = timed_torch(step, repeats)
    del opt, table
    torch.cuda.empty_cache()
    return ms


def torch_many_small_ms(shapes, repeats, **adam_kind):
    params = [torch.zeros(shape, device="cuda", requires_grad=True) for shape in shapes]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.Adam(params, lr=1e-3, eps=1e-7, **adam_kind)
    ms = timed_torch(opt.step, repeats)
    del opt, params
    torch.cuda.empty_cache()
    return ms


def many_small(repeats):
    """One LazyAdam step over 1,000 small float32 variables: the group call, one call per
    variable, and torch's multi-tensor Adam (fused, foreach) on the same shapes."""
    shapes = [(64, 64)] * 500 + [(64,)] * 500
    rule = "lazy_adam"
    vars_ = [cp.zeros(shape, cp.float32) for shape in shapes]
    slots = [[cp.zeros(shape, cp.float32) for shape in shapes] for _ in range(SLOTS[rule])]
    grads = [cp.ones(shape, cp.float32) for shape in shapes]
    hyper = HYPER[rule]
    entry = {"variables": len(shapes), "parameters": int(sum(np.prod(s) for s in shapes))}
    entry["group_ms"] = timed(lambda: core_cuda.apply_dense_group(rule, vars_, slots, grads,
                                                                 hyper), repeats)

    def per_variable():
        for i, var in enumerate(vars_):
            core_cuda.apply_dense(rule, var, [s[i] for s in slots], grads[i], hyper)
    entry["per_variable_ms"] = timed(per_variable, repeats)
    if torch is not None:
        entry["torch_fused_ms"] = torch_many_small_ms(shapes, repeats, fused=True)
        entry["torch_foreach_ms"] = torch_many_small_ms(shapes, repeats, foreach=True)
    return entry


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--elements", type=int, default=1 << 27)  # 128M: 0.5 GB per fp32 array
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    n = args.elements
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    results = {"device": dev["name"].decode(), "elements": n, "dense": [], "sparse": []}

    # Reference: device-to-device copy of one float32 array (bytes = read + write).
    src = cp.ones(n, cp.float32)
    dst = cp.empty_like(src)
    ms = timed(lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                                   cp.cuda.runtime.memcpyDeviceToDevice, 0),
               args.repeats)
    copy_gbs = 2 * src.nbytes / ms / 1e6
    results["copy_GBps"] = copy_gbs
    del src, dst

    for dtype in ("float32", "bfloat16"):
        storage = cp.float32 if dtype == "float32" else cp.uint16
        item = 4 if dtype == "float32" else 2
        for rule in SLOTS:
            # A table of rows of 64: a per-row slot holds one value per row.
            shape = (n // 64, 64)
            var = cp.zeros(shape, storage)
            slots = [cp.zeros(shape[:1] if per_row else shape, storage)
                     for per_row in PER_ROW[rule]]
            grad = cp.zeros(shape, storage)
            call = lambda: core_cuda.apply_dense(  # noqa: E731
                rule, var, slots, grad, HYPER[rule], dtype="bfloat16" if dtype == "bfloat16" else "")
            ms = timed(call, args.repeats)
            moved = item * (3 * var.size + 2 * sum(s.size for s in slots))
            gbs = moved / ms / 1e6
            entry = dict(rule=rule, dtype=dtype, ms=ms, GBps=gbs, fraction_of_copy=gbs / copy_gbs)
            if torch is not None and rule == "lazy_adam" and dtype == "float32":
                entry["torch_fused_adam_ms"] = torch_dense_adam_ms(n, args.repeats)
            results["dense"].append(entry)
            del var, slots, grad

    rows, width = 1 << 20, 64
    rng = np.random.default_rng(0)
    table = cp.zeros((rows, width), cp.float32)
    state = {rule: [cp.zeros(rows if per_row else (rows, width), cp.float32)
                    for per_row in PER_ROW[rule]] for rule in SPARSE_RULES}
    for batch, ids_kind in ((1 << 14, "zipf"), (1 << 17, "zipf"), (1 << 17, "uniform")):
        if ids_kind == "zipf":
            ids = np.minimum(rng.zipf(1.1, batch) - 1, rows - 1).astype(np.int64)
        else:
            ids = rng.integers(0, rows, batch).astype(np.int64)
        unique = np.unique(ids).size
        hottest = int(np.bincount(ids).max())
        indices = cp.asarray(ids)
        grad = cp.ones((batch, width), cp.float32)
        for rule in SPARSE_RULES:
            # Gradient rows and ids read; each touched row of var and slots read and written.
            row_values = width + sum(1 if per_row else width for per_row in PER_ROW[rule])
            moved = 4 * (width * batch + 2 * row_values * unique) + 8 * batch
            entry = dict(rule=rule, dtype="float32", rows=rows, width=width, batch=batch,
                         ids=ids_kind, unique_rows=int(unique), hottest_row=hottest)
            for mode, wait in (("wait", True), ("no_wait", False)):
                call = lambda: core_cuda.apply_sparse(  # noqa: E731
                    rule, table, state[rule], grad, indices, HYPER[rule], wait=wait)
                ms = timed(call, args.repeats)
                entry[f"{mode}_ms"] = ms
                entry[f"{mode}_GBps"] = moved / ms / 1e6
            if torch is not None and rule == "lazy_adam":
                entry["torch_sparse_adam_ms"] = torch_sparse_adam_ms(rows, width, ids,
                                                                     args.repeats)
            results["sparse"].append(entry)
        del grad, indices

    results["many_small"] = many_small(args.repeats)

    lines = [f"# fusedopt CUDA kernels on {results['device']}", "",
             f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write, {n} float32)", "",
             "| dense rule | dtype | ms/step | GB/s | of copy |", "|---|---|---|---|---|"]
    for r in results["dense"]:
        lines.append(f"| {r['rule']} | {r['dtype']} | {r['ms']:.3f} | {r['GBps']:.0f} | "
                     f"{100 * r['fraction_of_copy']:.0f}% |")
    for r in results["dense"]:
        if "torch_fused_adam_ms" in r:
            lines += ["", f"dense float32 Adam, {n} parameters: fusedopt {r['ms']:.3f} ms, "
                      f"torch.optim.Adam(fused=True) {r['torch_fused_adam_ms']:.3f} ms "
                      f"(fusedopt {r['torch_fused_adam_ms'] / r['ms']:.2f}x)"]
    lines += ["", "| sparse rule, float32 | table | ids | batch (unique rows, hottest row) | "
              "ms/step wait | ms/step no wait | GB/s no wait | torch SparseAdam ms | ratio |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results["sparse"]:
        peer = r.get("torch_sparse_adam_ms")
        lines.append(f"| {r['rule']} | {r['rows']}x{r['width']} | {r['ids']} | {r['batch']} "
                     f"({r['unique_rows']}, {r['hottest_row']}) | {r['wait_ms']:.3f} | "
                     f"{r['no_wait_ms']:.3f} | {r['no_wait_GBps']:.0f} | "
                     + (f"{peer:.3f} | {peer / r['no_wait_ms']:.1f}x |" if peer else "- | - |"))
    r = results["many_small"]
    lines += ["", f"many small: LazyAdam float32, {r['variables']} variables "
              f"({r['parameters']} parameters), ms/step", "",
              "| group call (multi-tensor) | one call per variable | torch fused | torch foreach |",
              "|---|---|---|---|",
              f"| {r['group_ms']:.3f} | {r['per_variable_ms']:.3f} | "
              + " | ".join(f"{r[k]:.3f}" if k in r else "-"
                           for k in ("torch_fused_ms", "torch_foreach_ms")) + " |"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "gpu_bench.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
