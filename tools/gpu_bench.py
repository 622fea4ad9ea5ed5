"""Bandwidth of fusedopt's CUDA kernels (fusedopt._core_cuda) on the GPU it runs on,
against a device-to-device copy measured in the same run. No TensorFlow needed.

    python tools/gpu_bench.py [--out DIR] [--elements N] [--repeats R]

Dense: every rule, float32 and bfloat16, N elements; bytes counted = what one fused pass
must move (read var, slots, grad; write var, slots). Sparse: LazyAdam float32 on a
1M x 64 table with Zipf-distributed ids (duplicates coalesced on the device); bytes =
gradient rows read + touched rows of var and slots read and written. Time: CUDA events
around `repeats` back-to-back calls, best of 3. Writes gpu_bench.json and gpu_bench.md
to --out (default: $OUT when set).
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

SLOTS = {"lazy_adam": 2, "adamax": 2, "adagrad": 1}
HYPER = {
    "lazy_adam": dict(beta1_power=0.9**3, beta2_power=0.999**3, lr=1e-3, beta1=0.9, beta2=0.999,
                      epsilon=1e-7),
    "adamax": dict(beta1_power=0.9**3, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7),
    "adagrad": dict(lr=0.01, epsilon=1e-7),
}


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
        for rule, k in SLOTS.items():
            var = cp.zeros(n, storage)
            slots = [cp.zeros(n, storage) for _ in range(k)]
            grad = cp.zeros(n, storage)
            call = lambda: core_cuda.apply_dense(  # noqa: E731
                rule, var, slots, grad, HYPER[rule], dtype="bfloat16" if dtype == "bfloat16" else "")
            ms = timed(call, args.repeats)
            moved = n * item * (2 * (1 + k) + 1)
            gbs = moved / ms / 1e6
            results["dense"].append(dict(rule=rule, dtype=dtype, ms=ms, GBps=gbs,
                                         fraction_of_copy=gbs / copy_gbs))
            del var, slots, grad

    rows, width = 1 << 20, 64
    rng = np.random.default_rng(0)
    table = cp.zeros((rows, width), cp.float32)
    m, v = cp.zeros_like(table), cp.zeros_like(table)
    for batch in (1 << 14, 1 << 17):
        ids = np.minimum(rng.zipf(1.1, batch) - 1, rows - 1).astype(np.int64)
        unique = np.unique(ids).size
        indices = cp.asarray(ids)
        grad = cp.ones((batch, width), cp.float32)
        call = lambda: core_cuda.apply_sparse(  # noqa: E731
            "lazy_adam", table, [m, v], grad, indices, HYPER["lazy_adam"])
        ms = timed(call, args.repeats)
        moved = 4 * width * (batch + 6 * unique) + 8 * batch
        results["sparse"].append(dict(rule="lazy_adam", dtype="float32", rows=rows, width=width,
                                      batch=batch, unique_rows=int(unique), ms=ms,
                                      GBps=moved / ms / 1e6))

    lines = [f"# fusedopt CUDA kernels on {results['device']}", "",
             f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write, {n} float32)", "",
             "| dense rule | dtype | ms/step | GB/s | of copy |", "|---|---|---|---|---|"]
    for r in results["dense"]:
        lines.append(f"| {r['rule']} | {r['dtype']} | {r['ms']:.3f} | {r['GBps']:.0f} | "
                     f"{100 * r['fraction_of_copy']:.0f}% |")
    lines += ["", "| sparse rule | table | batch (unique rows) | ms/step | GB/s |",
              "|---|---|---|---|---|"]
    for r in results["sparse"]:
        lines.append(f"| {r['rule']} {r['dtype']} | {r['rows']}x{r['width']} | {r['batch']} "
                     f"({r['unique_rows']}) | {r['ms']:.3f} | {r['GBps']:.0f} |")
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
