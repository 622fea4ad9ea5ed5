"""Repository rule: describe the TensorFlow installed in $PYTHON_BIN_PATH's environment.

TF is not built from source: headers and libtensorflow_framework.so.2 come from the pip wheel,
so the .so we build matches exactly the TF that will load it (a 2.21 build fails in 2.15).
Same idea as the public custom-op template's tf_configure.bzl.
"""

# Printed as JSON by the interpreter; TF_CPP_MIN_LOG_LEVEL keeps TF's banner out of stdout.
_QUERY = """
import json, sysconfig
import pybind11, tensorflow as tf
print(json.dumps(dict(
    version=tf.__version__,
    include=tf.sysconfig.get_include(),
    lib=tf.sysconfig.get_lib(),
    cflags=tf.sysconfig.get_compile_flags(),
    lflags=tf.sysconfig.get_link_flags(),
    pybind11=pybind11.get_include(),
    python_include=sysconfig.get_paths()["include"],
)))
"""

def _fail(msg, res):
    fail("tf_configure: %s\n%s%s" % (msg, res.stdout, res.stderr))

def _tf_configure_impl(rctx):
    python = rctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    if "/" not in python:
        found = rctx.which(python)
        if not found:
            fail("tf_configure: %s not found on PATH; set --repo_env=PYTHON_BIN_PATH" % python)
        python = str(found)
    elif not python.startswith("/"):
        # The rule runs inside the external repo dir, so a relative path would silently break.
        fail("tf_configure: PYTHON_BIN_PATH must be absolute, got " + python)

    res = rctx.execute([python, "-c", _QUERY], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if res.return_code != 0:
        _fail("cannot import tensorflow/pybind11 with " + python, res)
    info = json.decode(res.stdout.strip().splitlines()[-1])

    # Keep TF's -D flags (ABI, Eigen alignment) attached to the headers that require them.
    defines = [f[2:] for f in info["cflags"] if f.startswith("-D")]

    rctx.symlink(info["include"], "tf_include")
    rctx.symlink(info["lib"] + "/libtensorflow_framework.so.2", "libtensorflow_framework.so.2")
    # The XLA kernels (cc/tf/xla_kernels.cc) use XlaOpKernel & co., exported by libtensorflow_cc.
    rctx.symlink(info["lib"] + "/libtensorflow_cc.so.2", "libtensorflow_cc.so.2")
    rctx.symlink(info["pybind11"], "pybind11_include")
    rctx.symlink(info["python_include"], "python_include")

    cc = rctx.os.environ.get("CC") or rctx.which("gcc") or rctx.which("cc")
    compiler = "unknown"
    if cc:
        ver = rctx.execute([str(cc), "--version"])
        if ver.return_code == 0:
            compiler = ver.stdout.strip().splitlines()[0]

    rctx.file("build_info.json", json.encode_indent({
        "tensorflow_version": info["version"],
        "build_system": "bazel",
        "cuda": False,
        "xla": True,
        "compiler": compiler,
    }) + "\n")

    # Read by tools/bazel_pytest.sh: tests must run under the interpreter the .so was built for.
    rctx.file("python_bin", python + "\n")

    rctx.template("BUILD", rctx.attr._build_tpl, {
        "%{DEFINES}": repr(defines),
        "%{TF_VERSION}": info["version"],
        "%{PYTHON}": python,
    })

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    # Re-run when the interpreter (hence the TF version) or the compiler changes; `local` also
    # re-runs it once per Bazel server, so a `pip install -U tensorflow` in the same venv is
    # noticed (cost: one `import tensorflow`).
    environ = ["PYTHON_BIN_PATH", "CC"],
    configure = True,
    local = True,
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/tf:BUILD.tpl"))},
)
