"""Builds fusedopt's two native pieces against the installed TensorFlow.

* ``fusedopt/_fusedopt_ops.so``: the TF op library (g++ with tf.sysconfig flags).
* ``fusedopt/_core``: the pybind11 module over the TF-free core.

Both compile the files listed in ``cc/sources.bzl``, the list Bazel uses too.
Environment: ``FUSEDOPT_WERROR=1`` turns our own warnings into errors (CI);
``FUSEDOPT_JOBS`` caps parallel compiles (default: 2).

``FUSEDOPT_XLA=0`` leaves out the XLA kernels (``XLA_SRCS``: the ops then fail inside
``jit_compile``); by default they are built, linking ``libtensorflow_cc.so.2``.

``FUSEDOPT_WHEEL_FOR_TF=1`` (``tools/build_wheel.sh``, which also names the wheel for its
TensorFlow: ``fusedopt-tf2.21-cpu``) pins that TensorFlow minor (see ``wheel_pin``).

On x86-64 Linux both libraries are built to the glibc/libstdc++ floor of TensorFlow's own
wheel (``cc/compat/abi_floor.h``; ``FUSEDOPT_ABI_FLOOR=0`` turns that off), so the wheel can
be tagged manylinux as TensorFlow's is.

Without TensorFlow, pybind11 or setuptools >= 77 the build stops at once with one message
saying what to install (``prerequisite_problems``).

``FUSEDOPT_CUDA=1`` adds the CUDA kernels: nvcc (``$FUSEDOPT_NVCC``, else ``nvcc`` on PATH)
compiles ``GPU_SRCS`` for the targets in cc/core/gpu/nvcc_flags.txt (``FUSEDOPT_CUDA_ARCHS``,
e.g. ``sm_90``, builds for those instead: shorter), the op library registers GPU
kernels too (inert without a GPU: the library still loads in tensorflow-cpu), cudart is
linked statically (no libcudart.so dependency), and ``fusedopt._core_cuda`` (the CUDA
engine on device arrays) is built as well.
"""
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.abspath(__file__))
# Commands that compile, hence need TensorFlow (egg_info, dist_info and sdist do not).
BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "install", "develop", "editable_wheel",
                  "bdist_egg"}


# Headers the XLA kernels' includes need beyond TensorFlow's wheel (TF's XLA headers
# include them; the wheel does not ship them): (header, Debian package).
XLA_SYSTEM_HEADERS = (("highwayhash/arch_specific.h", "libhighwayhash-dev"),
                      ("farmhash.h", "libfarmhash-dev"))


def cxx_compiler():
    """The C++ compiler the build will call: $CXX, else Python's configured one, else g++."""
    import sysconfig

    command = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "g++"
    return shlex.split(command)[0]


def system_include_dirs(cxx):
    """Where the compiler looks for system headers. $FUSEDOPT_SYSTEM_INCLUDE_DIRS (os.pathsep
    separated) replaces the search, e.g. to check an environment without the packages."""
    given = os.environ.get("FUSEDOPT_SYSTEM_INCLUDE_DIRS")
    if given is not None:
        return [d for d in given.split(os.pathsep) if d]
    dirs = []
    try:  # the compiler's own list (`#include <...> search starts here:` ...)
        out = subprocess.run([cxx, "-E", "-x", "c++", "-", "-v"], input="", text=True,
                             capture_output=True, timeout=60).stderr
        listing = out.split("#include <...> search starts here:", 1)[1]
        dirs = [line.strip() for line in listing.split("End of search list.")[0].splitlines()
                if line.strip()]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return dirs or ["/usr/local/include", "/usr/include"]


def prerequisite_problems(argv):
    """What this environment lacks for the command in `argv` (phrases; [] when ready)."""
    problems = []
    try:
        import setuptools

        major = int(re.match(r"\d+", setuptools.__version__).group())
        if major < 77:  # PEP 639 `license = "Apache-2.0"` in pyproject.toml needs 77
            problems.append(f"setuptools {setuptools.__version__} is too old (needs >= 77)")
    except (ImportError, AttributeError):
        problems.append("setuptools is not installed")
    try:
        import pybind11  # noqa: F401
    except ImportError:
        problems.append("pybind11 is not installed")
    if BUILD_COMMANDS.intersection(argv[1:]):
        try:
            import tensorflow  # noqa: F401
        except ImportError as e:
            why = f"TensorFlow is not importable ({e})"
            if any("pip-build-env" in p for p in sys.path):
                why += (": pip's build isolation hides the environment's packages, "
                        "so the build must not be isolated")
            problems.append(why)
        problems += system_problems(os.environ.get("FUSEDOPT_XLA", "1") != "0")
    return problems


def system_problems(xla):
    """The system packages a build needs that are missing: a C++ compiler, and for the XLA
    kernels two header packages (phrases naming the packages and the command)."""
    problems = []
    cxx = cxx_compiler()
    if shutil.which(cxx) is None:
        problems.append(f"no C++ compiler: {cxx} is not on PATH (Debian: sudo apt-get install "
                        "g++; or set CXX)")
    if xla:  # (without a compiler: in the usual system directories)
        dirs = system_include_dirs(cxx)
        missing = [(header, package) for header, package in XLA_SYSTEM_HEADERS
                   if not any(os.path.exists(os.path.join(d, header)) for d in dirs)]
        if missing:
            headers = " and ".join(h for h, _ in missing)
            packages = " ".join(p for _, p in missing)
            problems.append(
                f"the XLA kernels need {headers}, which are not installed (Debian: sudo "
                f"apt-get install {packages}, or tools/install_system_deps.sh); or build "
                "without the XLA kernels, which the ops need inside jit_compile "
                "(FUSEDOPT_XLA=0 pip install --no-build-isolation .)")
    return problems


def prerequisites_message(problems):
    return (
        "fusedopt cannot be built here: " + "; ".join(problems) + ".\n"
        "fusedopt compiles against the TensorFlow it will run with, so it is built in that "
        "environment, without pip's build isolation. Install the prerequisites there, "
        "then build:\n"
        '    pip install tensorflow-cpu "setuptools>=77" pybind11   '
        "# or tensorflow; the version you use\n"
        "    pip install --no-build-isolation .\n"
        "(a prebuilt wheel for your TensorFlow, from tools/build_wheel.sh, needs none of this)")


_problems = prerequisite_problems(sys.argv)
if _problems:
    sys.exit(prerequisites_message(_problems))

from pybind11.setup_helpers import Pybind11Extension  # noqa: E402
from setuptools import Extension, setup  # noqa: E402
from setuptools.command.build_ext import build_ext  # noqa: E402

OPS_EXT = "fusedopt._fusedopt_ops"
WARNINGS = ["-Wall", "-Wextra"] + (["-Werror"] if os.environ.get("FUSEDOPT_WERROR") == "1" else [])
OPT = ["-O3", "-fno-math-errno"]
CUDA = os.environ.get("FUSEDOPT_CUDA") == "1"
XLA = os.environ.get("FUSEDOPT_XLA", "1") != "0"
# The glibc/libstdc++ floor of TensorFlow's own wheel (cc/compat/abi_floor.h): on x86-64
# Linux unless FUSEDOPT_ABI_FLOOR=0.
ABI_FLOOR = (os.environ.get("FUSEDOPT_ABI_FLOOR", "1") != "0" and sys.platform.startswith("linux")
             and platform.machine() == "x86_64")
CUDA_EXT = "fusedopt._core_cuda"


def nvcc_settings():
    """(flags, archs) from cc/core/gpu/nvcc_flags.txt, the one place all builds read."""
    settings = {}
    with open(os.path.join(ROOT, "cc", "core", "gpu", "nvcc_flags.txt")) as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep and not line.startswith("#"):
                settings[key.strip()] = value.split()
    return settings["flags"], settings["archs"]


def cuda_archs(release_archs):
    """The release targets, or $FUSEDOPT_CUDA_ARCHS (space- or comma-separated sm_XX /
    compute_XX): e.g. only the local GPU's, for a shorter build that runs only there."""
    given = os.environ.get("FUSEDOPT_CUDA_ARCHS", "").replace(",", " ").split()
    if not given:
        return release_archs
    bad = [a for a in given if not re.fullmatch(r"(sm|compute)_\d+[af]?", a)]
    if bad:
        sys.exit(f"FUSEDOPT_CUDA_ARCHS: {' '.join(bad)} is not a CUDA target (sm_XX for machine "
                 f"code, compute_XX for PTX; the release builds use: {' '.join(release_archs)})")
    return given


NVCC_BASE_FLAGS, RELEASE_CUDA_ARCHS = nvcc_settings()
CUDA_ARCHS = cuda_archs(RELEASE_CUDA_ARCHS)
# compute_XX -> PTX for later GPUs; sm_XX -> machine code.
NVCC_FLAGS = NVCC_BASE_FLAGS + [
    flag for arch in CUDA_ARCHS
    for flag in ("-gencode", "arch=compute_%s,code=%s" % (arch.split("_")[1], arch))]


def nvcc_path():
    nvcc = os.environ.get("FUSEDOPT_NVCC") or shutil.which("nvcc")
    if not nvcc:
        sys.exit("FUSEDOPT_CUDA=1 needs nvcc on PATH (or FUSEDOPT_NVCC=/path/to/nvcc)")
    return nvcc


def cuda_root(nvcc):
    """$CUDA_HOME, else the toolkit nvcc itself reports (nvcc may be a wrapper script)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    dry = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    top = re.search(r"^#\$ TOP=(.*)$", dry.stdout + dry.stderr, re.M)
    if top:
        return os.path.normpath(top.group(1).strip())
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def cudart_link_flags(nvcc):
    # Static cudart, kept private to our .so (--exclude-libs), placed BEFORE TF's link
    # flags: libtensorflow_framework exports cudart stubs that would otherwise win.
    static = os.path.join(cuda_root(nvcc), "lib64", "libcudart_static.a")
    return [static, "-ldl", "-lrt", "-lpthread", "-Wl,--exclude-libs,libcudart_static.a"]


def project_version():
    """The release, from fusedopt/__init__.py (its one home: pyproject.toml marks it dynamic)."""
    with open(os.path.join(ROOT, "python", "fusedopt", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def loader_module():
    """python/fusedopt/_loader.py (stdlib only), loaded by path: the wheel's version label and
    TensorFlow pin come from the same code as the loader's hint naming that wheel."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_fusedopt_loader", os.path.join(ROOT, "python", "fusedopt", "_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel_pin():
    """For FUSEDOPT_WHEEL_FOR_TF=1 (tools/build_wheel.sh): the requirement pinning the
    TensorFlow minor the wheel is built against.

    The pin names the distribution installed here (FUSEDOPT_TF_DIST overrides it):
    tensorflow-cpu and tensorflow install the same `tensorflow` package, and a requirement
    on the other one would make pip install a second TensorFlow over the first. The two
    wheels differ only in that pin; their names tell them apart (_loader.wheel_name:
    fusedopt-tf2.21 requires tensorflow, fusedopt-tf2.21-cpu tensorflow-cpu).
    """
    import tensorflow as tf

    loader = loader_module()
    dist = os.environ.get("FUSEDOPT_TF_DIST") or loader.tensorflow_distribution(tf.__version__)
    return loader.tensorflow_requirement(tf.__version__, dist)


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


def xla_flags(tf_compile_flags):
    """Extra flags for the XLA kernels TU (XLA_SRCS), which includes XLA's headers.

    * -DNDEBUG, as TensorFlow itself is built: XLA's inline functions compiled here keep no
      DCHECKs, whose absl logging instantiations TF 2.18 does not export (undefined symbol
      at load).
    * TF 2.19's wheel: xla/stream_executor/gpu/tma_metadata.h includes LLVM's
      llvm/ADT/ArrayRef.h and SmallVector.h, which the wheel does not ship. They declare a
      class fusedopt never uses, so the system's LLVM headers do ($FUSEDOPT_LLVM_INCLUDE,
      else `llvm-config --includedir`, else /usr/lib/llvm-*/include), searched after TF's
      own; ABI-breaking-check enforcement off, so nothing references an LLVM symbol.
    """
    flags = ["-DNDEBUG"]
    include = next((f[len("-isystem"):] for f in tf_compile_flags if f.startswith("-isystem")),
                   None)
    tma = os.path.join(include or "", "xla", "stream_executor", "gpu", "tma_metadata.h")
    if not include or not os.path.exists(tma):
        return flags
    with open(tma) as f:
        if '"llvm/ADT/ArrayRef.h"' not in f.read():
            return flags
    if os.path.exists(os.path.join(include, "llvm", "ADT", "ArrayRef.h")):
        return flags
    candidates = [os.environ.get("FUSEDOPT_LLVM_INCLUDE", "")]
    if shutil.which("llvm-config"):
        candidates.append(subprocess.run(["llvm-config", "--includedir"], capture_output=True,
                                         text=True).stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/llvm-*/include"), reverse=True)
    for candidate in candidates:
        if candidate and os.path.exists(os.path.join(candidate, "llvm", "ADT", "ArrayRef.h")):
            return flags + ["-idirafter", candidate, "-DLLVM_DISABLE_ABI_BREAKING_CHECKS_ENFORCING=1"]
    sys.exit(f"{tma} includes LLVM's llvm/ADT/ArrayRef.h, which this TensorFlow wheel does not "
             "ship (TF 2.19). Install LLVM's headers (Debian: apt-get install llvm-dev) or set "
             "FUSEDOPT_LLVM_INCLUDE=DIR (holding llvm/ADT/ArrayRef.h), or build without the XLA "
             "kernels: FUSEDOPT_XLA=0")


def tensorflow_lib_dir():
    import tensorflow as tf

    return os.path.dirname(tf.__file__)


def compiler_version(cxx):
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return next((line for line in out.splitlines() if "release" in line), out.strip())


class BuildFusedOpt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        # The extensions build side by side (the op library's files in a pool of their own,
        # _core and _core_cuda beside it), so no core idles while a one-file module
        # compiles; COMPILE_SLOTS still caps the compiler processes at FUSEDOPT_JOBS.
        if not self.parallel and len(self.extensions) > 1:
            self.parallel = len(self.extensions)

    def run(self):
        if not CUDA:
            # An earlier FUSEDOPT_CUDA=1 build in this tree left _core_cuda in build/lib (or the
            # package dir): a CPU build must not ship it.
            stale = self.get_ext_fullpath(CUDA_EXT)
            if os.path.exists(stale):
                os.remove(stale)
        super().run()

    def get_ext_filename(self, fullname):
        # A TF op library, not a Python extension module: no ABI suffix. setuptools
        # asks with the full dotted name or (editable installs) the last part only.
        if fullname.split(".")[-1] == OPS_EXT.split(".")[-1]:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extensions(self):
        super().build_extensions()
        # After every library is linked: record each one's size and sha256.
        info = getattr(self, "_build_info_path", None)
        if info and os.path.exists(info):
            record_libraries(info, [self.get_ext_fullpath(ext.name) for ext in self.extensions])

    def copy_extensions_to_source(self):
        # Editable installs copy the built libraries into python/fusedopt; the build
        # info must travel with the op library it describes.
        super().copy_extensions_to_source()
        built = getattr(self, "_build_info_path", None)
        if built and os.path.exists(built):
            self.copy_file(built, os.path.join(ROOT, "python", "fusedopt", "_build_info.json"))

    def submit_gpu_objects(self, pool):
        """Queues nvcc's compiles of GPU_SRCS on `pool` (once; their objects are shared by
        the op library and _core_cuda): a list of futures of the object paths."""
        with GPU_SUBMIT:  # _core_cuda's build may ask at the same time as the op library's
            return self._submit_gpu_objects(pool)

    def _submit_gpu_objects(self, pool):
        if getattr(self, "_gpu_futures", None) is None:
            nvcc = nvcc_path()
            obj_dir = os.path.join(self.build_temp, "gpu")
            os.makedirs(obj_dir, exist_ok=True)

            def compile_one(src):
                obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
                run([nvcc, *NVCC_FLAGS, "-I", ROOT, "-c", os.path.join(ROOT, src), "-o", obj])
                return obj

            self._gpu_futures = [pool.submit(compile_one, src) for src in lists["GPU_SRCS"]]
        return self._gpu_futures

    def compile_gpu_objects(self, jobs):
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return [f.result() for f in self.submit_gpu_objects(pool)]

    def build_extension(self, ext):
        jobs = JOBS
        if ext.name == CUDA_EXT:
            nvcc = nvcc_path()
            cudart, *system_libs = cudart_link_flags(nvcc)
            # The device objects first, holding no slot (their compiles take slots of their own).
            ext.extra_objects = [*self.compile_gpu_objects(jobs), cudart]
            ext.extra_link_args = [*ext.extra_link_args, *system_libs]
            # cuda_runtime.h for cudaMallocAsync & co.; a system header (no -Werror noise).
            ext.extra_compile_args = [*ext.extra_compile_args,
                                      "-isystem", os.path.join(cuda_root(nvcc), "include")]
        if ext.name != OPS_EXT:
            with COMPILE_SLOTS:  # a one-file module: one compile, then its link
                return super().build_extension(ext)
        cxx = os.environ.get("CXX", "g++")
        tf_version, tf_compile, tf_link = tensorflow_flags()
        out = self.get_ext_fullpath(ext.name)
        obj_dir = os.path.join(self.build_temp, "ops_cuda" if CUDA else "ops")
        os.makedirs(obj_dir, exist_ok=True)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        flags = ["-std=c++17", "-fPIC", *OPT, *WARNINGS, "-I", ROOT, *tf_compile, *abi_floor_flags()]
        if CUDA:
            flags.append("-DFUSEDOPT_CUDA=1")  # GPU registrations (host code: no CUDA headers)

        extra = {src: xla_flags(tf_compile) for src in lists["XLA_SRCS"]} if XLA else {}

        def compile_one(src):
            obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
            run([cxx, *flags, *extra.get(src, []), "-c", os.path.join(ROOT, src), "-o", obj])
            return obj

        gpu_link = cudart_link_flags(nvcc_path()) if CUDA else []
        xla_sources, xla_link = [], []
        if XLA:
            xla_sources = lists["XLA_SRCS"]
            xla_link = [os.path.join(tensorflow_lib_dir(), "libtensorflow_cc.so.2")]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            # One queue for g++'s and nvcc's files, the slowest compiles first (XLA's, then
            # the device code); the host files fill the workers as they free up.
            pending = [pool.submit(compile_one, src) for src in xla_sources]
            gpu_pending = self.submit_gpu_objects(pool) if CUDA else []
            pending += [pool.submit(compile_one, src) for src in ext.sources]
            objects = [f.result() for f in pending]
            gpu_objects = [f.result() for f in gpu_pending]
        run([cxx, "-shared", *objects, *gpu_objects, "-o", out, *gpu_link, *tf_link, *xla_link])
        self._build_info_path = write_build_info(
            os.path.dirname(out), tf_version, "setuptools", compiler_version(cxx),
            cuda=nvcc_version(nvcc_path()) if CUDA else None)


JOBS = int(os.environ.get("FUSEDOPT_JOBS", "2"))
if JOBS < 1:
    sys.exit(f"FUSEDOPT_JOBS must be at least 1, got {JOBS}")
# At most JOBS compiler or linker processes at once, whichever extension they build.
COMPILE_SLOTS = threading.BoundedSemaphore(JOBS)
GPU_SUBMIT = threading.Lock()


def run(cmd):
    with COMPILE_SLOTS:
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        subprocess.run(cmd, check=True)


def library_record(path):
    """Size and sha256 of a built library: the loader refuses a file that differs (a
    truncated copy would otherwise crash the process with SIGBUS when loaded)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def record_libraries(info_path, libraries):
    """Adds "libraries" (file name -> size, sha256) to the build info at info_path."""
    with open(info_path) as f:
        info = json.load(f)
    info["libraries"] = {os.path.basename(p): library_record(p)
                         for p in libraries if os.path.isfile(p)}
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)


def write_build_info(package_dir, tf_version, build_system, compiler, cuda=None):
    info = {
        "fusedopt_version": project_version(),
        "tensorflow_version": tf_version,
        "build_system": build_system,
        "compiler": compiler,
        "cuda": bool(cuda),
        "xla": XLA,
    }
    if cuda:
        info["cuda_archs"] = CUDA_ARCHS
        info["nvcc"] = cuda
    path = os.path.join(package_dir, "_build_info.json")
    with open(path, "w") as f:
        json.dump(info, f, indent=1)
    return path


def abi_floor_flags():
    return ["-include", os.path.join(ROOT, lists["ABI_FLOOR_HDRS"][0])] if ABI_FLOOR else []


lists = sources()
abi_floor_srcs = lists["ABI_FLOOR_SRCS"] if ABI_FLOOR else []
gpu_depends = lists["GPU_HDRS"] + lists["GPU_CUDA_HDRS"] + lists["GPU_SRCS"]
extensions = [
    Extension(OPS_EXT, sources=lists["TF_SRCS"] + abi_floor_srcs,
              depends=lists["CORE_HDRS"] + lists["TF_HDRS"] + lists["XLA_HDRS"]
              + lists["ABI_FLOOR_HDRS"]
              + lists["XLA_SRCS"] + (gpu_depends if CUDA else [])),
    Pybind11Extension(
        "fusedopt._core",
        sources=lists["PYBIND_SRCS"] + abi_floor_srcs,
        include_dirs=[ROOT],
        depends=lists["CORE_HDRS"] + lists["PYBIND_HDRS"] + lists["ABI_FLOOR_HDRS"],
        cxx_std=20,  # templated lambdas for dtype dispatch
        extra_compile_args=[*OPT, *WARNINGS, *abi_floor_flags()],
    ),
]
if CUDA:
    extensions.append(Pybind11Extension(
        CUDA_EXT,
        sources=lists["PYBIND_CUDA_SRCS"],
        include_dirs=[ROOT],
        depends=lists["CORE_HDRS"] + lists["PYBIND_HDRS"] + gpu_depends,
        cxx_std=20,
        extra_compile_args=[*OPT, *WARNINGS],
    ))
version, requirements = project_version(), ["numpy"]
if os.environ.get("FUSEDOPT_WHEEL_FOR_TF") == "1":
    requirements.append(wheel_pin())
setup(version=version, install_requires=requirements, ext_modules=extensions,
      cmdclass={"build_ext": BuildFusedOpt})
