"""A/B of two builds of fusedopt._core (the TF-free engine) on the sparse step.

    python benchmarks/experiments/core_build_ab.py build DIR            # this tree's _core -> DIR
    python benchmarks/experiments/core_build_ab.py compare DIR_A DIR_B [--rounds 3] [--out F.json] [--quick]
        [--rules adagrad,lazy_adam,...]

`build` compiles cc/pybind/core_module.cc as the package does (g++ -O3, C++20) into DIR, so
one can build at two commits and compare. `compare` runs the same step in fresh processes,
A and B alternating, `rounds` times each: `_core.apply_sparse` of each rule (--rules: any of
`_core.rules()`, default Adagrad and LazyAdam) on a 1M x 64 float32 table, 16,384 Zipf(1.1) ids a step (8 batches cycled), at 1 and 2 threads,
after the engine's 2 MB pages are collapsed. Prints the mean ms per step of each build and
B/A. --quick: a tiny table (a smoke run). BENCHMARKS.md, "Gradient rows prefetched".
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import glob, importlib.machinery, importlib.util, json, sys, time
import numpy as np
path, rows, dim, ids, steps = sys.argv[1], *map(int, sys.argv[2:6])
loader = importlib.machinery.ExtensionFileLoader("_core", path)
core = importlib.util.module_from_spec(importlib.util.spec_from_loader("_core", loader))
loader.exec_module(core)
rng = np.random.default_rng(0)
batches = [((rng.zipf(1.1, ids) - 1) % rows).astype(np.int64) for _ in range(8)]
grads = [rng.standard_normal((ids, dim)).astype(np.float32) for _ in range(8)]
wanted = sys.argv[6].split(",")
hyper_values = dict(beta1_power=0.9, beta2_power=0.999, lr=0.01, beta1=0.9, beta2=0.999,
                    epsilon=1e-7, rho=0.9, momentum=0.5)
rules = {}
for rule in wanted:
    info = core.rules()[rule]
    shapes = {"per_element": (rows, dim), "per_row": (rows,)}
    slots = [np.full(shapes[info["slot_layouts"][s]], 0.1, np.float32) for s in info["slots"]]
    rules[rule] = (slots, {h: hyper_values[h] for h in info["hyper"]})
out = {}
for rule, (slots, hyper) in rules.items():
    var = np.full((rows, dim), 0.01, np.float32)
    for threads in (1, 2):
        step = lambda k: core.apply_sparse(rule, var, slots, grads[k % 8], batches[k % 8],
                                           hyper, {}, threads)
        for k in range(16):
            step(k)
        while core.huge_page_stats()["pending_bytes"]:
            time.sleep(0.05)
        t0 = time.perf_counter()
        for k in range(steps):
            step(k)
        out[f"{rule}, {threads} thread{'s' if threads > 1 else ''}"] = (
            (time.perf_counter() - t0) / steps * 1e3)
print("RESULT", json.dumps(out))
"""


def module_in(directory):
    found = glob.glob(os.path.join(directory, "_core.*so"))  # not _core_cuda
    if len(found) != 1:
        sys.exit(f"{directory}: expected one _core.*so, found {found or 'none'}")
    return found[0]


def build(directory):
    import pybind11
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["g++", "-std=c++20", "-O3", "-fno-math-errno", "-fPIC", "-shared",
                    "-fvisibility=hidden", "-I" + ROOT, "-I" + pybind11.get_include(),
                    "-I" + sysconfig.get_paths()["include"],
                    os.path.join(ROOT, "cc", "pybind", "core_module.cc"), "-o", target,
                    "-lpthread"], check=True)
    print(target)


def run(path, sizes, rules):
    proc = subprocess.run([sys.executable, "-c", CHILD, path, *map(str, sizes), ",".join(rules)],
                          capture_output=True, text=True, check=True)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def compare(dir_a, dir_b, rounds, quick, out, rules=("adagrad", "lazy_adam")):
    sizes = (2000, 8, 256, 5) if quick else (1_000_000, 64, 16_384, 400)
    paths = {"A": module_in(dir_a), "B": module_in(dir_b)}
    runs = {"A": [], "B": []}
    for _ in range(rounds):
        for name in runs:
            runs[name].append(run(paths[name], sizes, rules))
    summary = {}
    print(f"A = {paths['A']}\nB = {paths['B']}\n{rounds} processes each, alternating; ms per step")
    for step in runs["A"][0]:
        a = [r[step] for r in runs["A"]]
        b = [r[step] for r in runs["B"]]
        summary[step] = dict(a_ms=a, b_ms=b, b_over_a=sum(b) / sum(a))
        print(f"{step:34s} A {' '.join(f'{x:6.3f}' for x in a)}   B {' '.join(f'{x:6.3f}' for x in b)}"
              f"   B/A {summary[step]['b_over_a']:.3f}")
    if out:
        with open(out, "w") as f:
            json.dump({"paths": paths, "sizes": sizes, "runs": runs, "summary": summary}, f,
                      indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_args = commands.add_parser("build")
    build_args.add_argument("directory")
    compare_args = commands.add_parser("compare")
    compare_args.add_argument("dir_a")
    compare_args.add_argument("dir_b")
    compare_args.add_argument("--rounds", type=int, default=3)
    compare_args.add_argument("--out")
    compare_args.add_argument("--quick", action="store_true")
    compare_args.add_argument("--rules", default="adagrad,lazy_adam",
                              help="comma-separated rules of _core.rules() (default: %(default)s)")
    args = parser.parse_args()
    if args.command == "build":
        build(args.directory)
    else:
        compare(args.dir_a, args.dir_b, args.rounds, args.quick, args.out, args.rules.split(","))


if __name__ == "__main__":
    main()
