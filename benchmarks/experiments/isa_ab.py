"""A/B of the CPU element loop's two compilations (cc/core/cpu_isa.h) through the TF op.

    python benchmarks/experiments/isa_ab.py [--rounds 3] [--out FILE.json] [--quick]

Runs the same measurement in fresh processes with FUSEDOPT_CPU_ISA unset (AVX2 where the CPU
has it) and =baseline (x86-64 SSE2), alternating, `rounds` times each: the dense LazyAdam op
at several sizes (float32, tf.function, two alternating gradients) and the group op over
500 x [64,64] + 500 x [64] variables (the benchmark's many-small step). Prints the median
milliseconds per step of each ISA and their ratio. --quick: tiny sizes (a smoke run).
"""
import argparse
import json
import os
import subprocess
import sys

SIZES = [1 << 16, 1 << 20, 1 << 22, 1 << 24]
SMALL_PAIRS = 500  # the many-small step: SMALL_PAIRS x [64, 64] + SMALL_PAIRS x [64]

CHILD = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
from fusedopt import ops
out = {"isa": ops.cpu_isa()}
def median_ms(step, n):
    step(0); step(1)
    ts = []
    for i in range(n):
        t0 = time.perf_counter(); step(i); ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3
rng = np.random.default_rng(1)
hyper = dict(beta1_power=0.9, beta2_power=0.999, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7)
for n in SIZES:
    var = tf.Variable(rng.normal(0, 0.05, n).astype(np.float32))
    m, v = tf.Variable(tf.zeros([n])), tf.Variable(tf.zeros([n]))
    grads = [tf.constant(rng.normal(0, 1, n).astype(np.float32)) for _ in range(2)]
    f = tf.function(lambda g: ops.resource_apply_lazy_adam(var, m, v, grad=g, **hyper) and None)
    out["dense_%d" % n] = median_ms(lambda i: f(grads[i % 2]), 200 if n <= 1 << 20 else 30)
shapes = [(64, 64)] * SMALL_PAIRS + [(64,)] * SMALL_PAIRS
vs = [tf.Variable(rng.normal(0, 0.05, s).astype(np.float32)) for s in shapes]
ms = [tf.Variable(tf.zeros(s)) for s in shapes]
ss = [tf.Variable(tf.zeros(s)) for s in shapes]
gs = [tf.constant(rng.normal(0, 1, s).astype(np.float32)) for s in shapes]
group = tf.function(lambda: ops.resource_group_apply_lazy_adam(vs, ms, ss, grad=gs, **hyper)
                    and None)
out["many_small_group"] = median_ms(lambda i: group(), 60)
print("RESULT", json.dumps(out))
"""


def run(isa, sizes, small_pairs):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("FUSEDOPT_CPU_ISA", None)
    if isa == "baseline":
        env["FUSEDOPT_CPU_ISA"] = "baseline"
    child = CHILD.replace("SMALL_PAIRS", repr(small_pairs)).replace("SIZES", repr(sizes))
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                          text=True, check=True)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes, small_pairs = ([1 << 12], 4) if args.quick else (SIZES, SMALL_PAIRS)
    runs = {"default": [], "baseline": []}
    for _ in range(args.rounds):
        for isa in runs:
            runs[isa].append(run(isa, sizes, small_pairs))
    keys = [k for k in runs["default"][0] if k != "isa"]
    import statistics
    summary = {}
    print(f"default ISA: {runs['default'][0]['isa']}; {args.rounds} processes each, alternating")
    print(f"{'step':28s} {'default ms':>11s} {'baseline ms':>12s} {'baseline/default':>17s}")
    for k in keys:
        a = statistics.median(r[k] for r in runs["default"])
        b = statistics.median(r[k] for r in runs["baseline"])
        summary[k] = {"default_ms": a, "baseline_ms": b, "speedup": b / a}
        print(f"{k:28s} {a:11.3f} {b:12.3f} {b / a:17.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"isa": runs["default"][0]["isa"], "summary": summary, "runs": runs}, f,
                      indent=1)


if __name__ == "__main__":
    main()
