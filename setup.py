"""Builds fusedopt's two native pieces against the installed TensorFlow.

* ``fusedopt/_fusedopt_ops.so``: the TF op library (g++ with tf.sysconfig flags).
* ``fusedopt/_core``: the pybind11 module over the TF-free core.

Both compile the files listed in ``cc/sources.bzl``, the list Bazel uses too.
Environment: ``FUSEDOPT_WERROR=1`` turns our own warnings into errors (CI);
``FUSEDOPT_JOBS`` caps parallel compiles (default: 2).
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
OPS_EXT = "fusedopt._fusedopt_ops"
WARNINGS = ["-Wall", "-Wextra"] + (["-Werror"] if os.environ.get("FUSEDOPT_WERROR") == "1" else [])
OPT = ["-O3", "-fno-math-errno"]


def project_version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


def sources():
    namespace = {}
    with open(os.path.join(ROOT, "cc", "sources.bzl")) as f:
        exec(f.read(), namespace)  # Starlark lists of strings are Python
    return namespace


def tensorflow_flags():
    import tensorflow as tf

    # -isystem: TF's headers are not ours to warn about.
    compile_flags = [f.replace("-I", "-isystem", 1) if f.startswith("-I") else f
                     for f in tf.sysconfig.get_compile_flags()]
    return tf.__version__, compile_flags, list(tf.sysconfig.get_link_flags())


def compiler_version(cxx):
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


class BuildFusedOpt(build_ext):
    def get_ext_filename(self, fullname):
        # A TF op library, not a Python extension module: no ABI suffix. setuptools
        # asks with the full dotted name or (editable installs) the last part only.
        if fullname.split(".")[-1] == OPS_EXT.split(".")[-1]:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def copy_extensions_to_source(self):
        # Editable installs copy the built libraries into python/fusedopt; the build
        # info must travel with the op library it describes.
        super().copy_extensions_to_source()
        built = getattr(self, "_build_info_path", None)
        if built and os.path.exists(built):
            self.copy_file(built, os.path.join(ROOT, "python", "fusedopt", "_build_info.json"))

    def build_extension(self, ext):
        if ext.name != OPS_EXT:
            return super().build_extension(ext)
        cxx = os.environ.get("CXX", "g++")
        tf_version, tf_compile, tf_link = tensorflow_flags()
        out = self.get_ext_fullpath(ext.name)
        obj_dir = os.path.join(self.build_temp, "ops")
        os.makedirs(obj_dir, exist_ok=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        flags = ["-std=c++17", "-fPIC", *OPT, *WARNINGS, "-I", ROOT, *tf_compile]

        def compile_one(src):
            obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
            run([cxx, *flags, "-c", os.path.join(ROOT, src), "-o", obj])
            return obj

        jobs = int(os.environ.get("FUSEDOPT_JOBS", "2"))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = list(pool.map(compile_one, ext.sources))
        run([cxx, "-shared", *objects, "-o", out, *tf_link])
        self._build_info_path = write_build_info(
            os.path.dirname(out), tf_version, "setuptools", compiler_version(cxx))


def run(cmd):
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def write_build_info(package_dir, tf_version, build_system, compiler):
    info = {
        "fusedopt_version": project_version(),
        "tensorflow_version": tf_version,
        "build_system": build_system,
        "compiler": compiler,
        "cuda": False,
    }
    path = os.path.join(package_dir, "_build_info.json")
    with open(path, "w") as f:
        json.dump(info, f, indent=1)
    return path


lists = sources()
setup(
    ext_modules=[
        Extension(OPS_EXT, sources=lists["TF_SRCS"], depends=lists["CORE_HDRS"] + lists["TF_HDRS"]),
        Pybind11Extension(
            "fusedopt._core",
            sources=lists["PYBIND_SRCS"],
            include_dirs=[ROOT],
            depends=lists["CORE_HDRS"],
            cxx_std=20,  # templated lambdas for dtype dispatch
            extra_compile_args=[*OPT, *WARNINGS],
        ),
    ],
    cmdclass={"build_ext": BuildFusedOpt},
)
