"""Usage: PYTHON tools/wheel_identity.py PYPROJECT_TOML
       PYTHON tools/wheel_identity.py --newer TAG... (the tag needing the newest glibc)

For tools/build_wheel.sh, run by the Python whose TensorFlow the wheel is built against:
renames the project in PYPROJECT_TOML (the unpacked sdist's: setup() cannot override a name
pyproject.toml declares) to the wheel's name for this TensorFlow (_loader.wheel_name:
fusedopt-tf2.21-cpu), and prints that name and the manylinux platform tag of the installed
TensorFlow wheel (its WHEEL file; "none" when it has none, e.g. a source build).

FUSEDOPT_TF_DIST=tensorflow|tensorflow-cpu names the wheel for the other distribution.
"""
import importlib.metadata
import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_LINE = 'name = "fusedopt"\n'


def loader():
    """python/fusedopt/_loader.py by path: the package itself needs its built libraries."""
    spec = importlib.util.spec_from_file_location(
        "_fusedopt_loader", os.path.join(ROOT, "python", "fusedopt", "_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The legacy aliases of PEP 600 tags.
LEGACY_TAGS = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_of(tag):
    """manylinux_2_27_x86_64 -> (2, 27); manylinux2014_x86_64 -> (2, 17); else None."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if match:
        return int(match[1]), int(match[2])
    return LEGACY_TAGS.get(tag.split("_", 1)[0])


def tensorflow_platform_tag(distribution):
    """The installed TensorFlow wheel's manylinux tag, as manylinux_X_Y_<arch>, or "none"."""
    wheel = importlib.metadata.distribution(distribution).read_text("WHEEL") or ""
    tags = [tag.rsplit("-", 1)[-1] for tag in re.findall(r"^Tag: (\S+)", wheel, re.M)]
    found = [(glibc_of(tag), tag.split("_", 1)[1] if tag.split("_", 1)[0] in LEGACY_TAGS
              else tag.split("_", 3)[3]) for tag in tags if glibc_of(tag)]
    if not found:
        return "none"
    (major, minor), arch = min(found)
    return f"manylinux_{major}_{minor}_{arch}"


def newer(*tags):
    """Of manylinux tags, the one needing the newest glibc: a wheel is tagged for what both
    TensorFlow and its own symbols need."""
    return max(tags, key=glibc_of)


def main(pyproject):
    import tensorflow as tf

    load = loader()
    installed = load.tensorflow_distribution(tf.__version__)
    name = load.wheel_name(tf.__version__, os.environ.get("FUSEDOPT_TF_DIST") or installed)
    with open(pyproject) as f:
        text = f.read()
    if text.count(PROJECT_LINE) != 1:
        sys.exit(f"wheel_identity: {pyproject} has no line {PROJECT_LINE.strip()!r}")
    with open(pyproject, "w") as f:
        f.write(text.replace(PROJECT_LINE, f'name = "{name}"\n'))
    print(name, tensorflow_platform_tag(installed))


if __name__ == "__main__":
    if sys.argv[1] == "--newer":  # tools/wheel_identity.py --newer TAG...
        print(newer(*sys.argv[2:]))
    else:
        main(sys.argv[1])
