"""A/B of moving cache-aliased buffers apart (cc/core/cache_alias.h) through the TF ops.

    python benchmarks/experiments/separation_ab.py [--rounds 2] [--out FILE.json] [--quick]

Runs the same measurement in fresh processes with FUSEDOPT_SEPARATE_BUFFERS unset (on) and
=0 (off), alternating, `rounds` times each. Each process builds `SETUPS` identical dense
LazyAdam setups one after another, as a program creating variables and slots does (TF's
allocator then places equal-size tensors at exact power-of-two distances), times each
setup's step (tf.function, median), and then a sparse step over a [2^20, 64] table
(16,384 ids). Prints each setup's median ms with the separation on and off, how many of its
buffer pairs were cache-aliased when built, and what the kernels moved.
--quick: tiny sizes (a smoke run; nothing is large enough to move).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, json, time
import numpy as np
import tensorflow as tf
from fusedopt import ops
N, SETUPS, ROWS, IDS, STEPS = {n}, {setups}, {rows}, {ids}, {steps}
_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype = ctypes.c_void_p
_get.argtypes = [ctypes.py_object, ctypes.c_char_p]

def address(v):
    capsule = tf.experimental.dlpack.to_dlpack(v.read_value())
    return ctypes.c_void_p.from_address(_get(capsule, b"dltensor")).value

def aliased_pairs(vs):
    a = [address(v) for v in vs]
    d = [(a[i] - a[j]) % (1 << 28) for i in range(len(a)) for j in range(i)]
    return sum(x < (64 << 10) or x > (1 << 28) - (64 << 10) for x in d)

def settle():  # the huge-page collapse of new buffers runs in the background
    deadline = time.monotonic() + 120
    while ops.huge_page_stats()["pending_bytes"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)

def median_ms(step, n):
    ts = []
    for i in range(n):
        t0 = time.perf_counter(); step(i); ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3

hyper = dict(beta1_power=0.9, beta2_power=0.999, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7)
rng = np.random.default_rng(0)
out = dict(dense_ms=[], dense_aliased_pairs=[], dense_n=N)
steps = []
for _ in range(SETUPS):
    var = tf.Variable(tf.random.normal([N], stddev=0.05))
    m, v = tf.Variable(tf.zeros([N])), tf.Variable(tf.zeros([N]))
    out["dense_aliased_pairs"].append(aliased_pairs([var, m, v]))
    grad = tf.random.normal([N])
    steps.append(tf.function(lambda var=var, m=m, v=v, grad=grad:
                             ops.resource_apply_lazy_adam(var, m, v, grad=grad, **hyper) and None))
for step in steps:
    step()
settle()
times = [[] for _ in steps]
for _ in range(STEPS):  # interleaved: every setup sees the same machine
    for k, step in enumerate(steps):
        t0 = time.perf_counter(); step(); times[k].append(time.perf_counter() - t0)
out["dense_ms"] = [float(np.median(t)) * 1e3 for t in times]
del steps
table = tf.Variable(tf.random.normal([ROWS, 64], stddev=0.05))
m, v = tf.Variable(tf.zeros([ROWS, 64])), tf.Variable(tf.zeros([ROWS, 64]))
out["sparse_aliased_pairs"] = aliased_pairs([table, m, v])
ids = [tf.constant(rng.integers(0, ROWS, IDS)) for _ in range(2)]
rows = tf.random.normal([IDS, 64])
sparse = tf.function(lambda i: ops.resource_sparse_apply_lazy_adam(
    table, m, v, grad=rows, indices=i, **hyper) and None)
sparse(ids[0]); sparse(ids[1])
settle()
out["sparse_ms"] = median_ms(lambda i: sparse(ids[i % 2]), 5 * STEPS)
out["moved"] = ops.buffer_separation_stats()
print("RESULT", json.dumps(out))
"""


def run(setting, sizes):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("FUSEDOPT_SEPARATE_BUFFERS", None)
    if setting == "off":
        env["FUSEDOPT_SEPARATE_BUFFERS"] = "0"
    proc = subprocess.run([sys.executable, "-c", CHILD.format(**sizes)], env=env,
                          capture_output=True, text=True, check=True)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = (dict(n=4096, setups=2, rows=1024, ids=64, steps=3) if args.quick else
             dict(n=1 << 27, setups=3, rows=1 << 20, ids=16384, steps=12))
    runs = {"on": [], "off": []}
    for _ in range(args.rounds):
        for setting in runs:
            runs[setting].append(run(setting, sizes))
    summary = {}
    print(f"{args.rounds} processes each, alternating; dense LazyAdam, {sizes['n']:,} parameters")
    print(f"{'step':34s} {'on ms':>9s} {'off ms':>9s} {'off/on':>7s}  aliased pairs when built")
    rows = [(f"dense, setup {k}", lambda r, k=k: r["dense_ms"][k],
             lambda r, k=k: r["dense_aliased_pairs"][k]) for k in range(sizes["setups"])]
    rows.append((f"sparse [{sizes['rows']:,}, 64], {sizes['ids']:,} ids", lambda r: r["sparse_ms"],
                 lambda r: r["sparse_aliased_pairs"]))
    for name, ms, pairs in rows:
        on = statistics.median(ms(r) for r in runs["on"])
        off = statistics.median(ms(r) for r in runs["off"])
        built = sorted({pairs(r) for rs in runs.values() for r in rs})
        summary[name] = {"on_ms": on, "off_ms": off, "speedup": off / on, "aliased_pairs": built}
        print(f"{name:34s} {on:9.2f} {off:9.2f} {off / on:7.2f}  {built}")
    print("moved (on):", [r["moved"]["moved_buffers"] for r in runs["on"]],
          "buffers per process; off:", [r["moved"]["moved_buffers"] for r in runs["off"]])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"sizes": sizes, "summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
