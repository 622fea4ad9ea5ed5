"""The built libraries keep to TensorFlow's own glibc/libstdc++ floor (cc/compat/abi_floor.h),
which is what lets the wheel carry TensorFlow's manylinux tag; and the libstdc++ stand-ins
that floor needs (cc/compat/abi_floor.cc) behave as the functions they replace.

tools/check_wheel.sh checks the wheel itself with auditwheel (CI)."""
import os
import re
import shutil
import subprocess

import pytest

from fusedopt import _core, _loader

VERSIONED = re.compile(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9][0-9.]*)\b")


def required_versions(library):
    """The newest version of each of glibc, libstdc++ and its C++ ABI that `library`'s
    dynamic symbols need, as {"GLIBC": (2, 16), ...} (objdump -T: binutils, which the
    compiler that built it came with)."""
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to read the libraries' symbol versions"
    out = subprocess.run([objdump, "-T", library], capture_output=True, text=True,
                         check=True).stdout
    newest = {}
    for name, version in VERSIONED.findall(out):
        parsed = tuple(int(x) for x in version.strip(".").split("."))
        newest[name] = max(newest.get(name, parsed), parsed)
    return newest


def tensorflow_libraries():
    import tensorflow as tf

    folder = os.path.dirname(tf.__file__)
    return [os.path.join(folder, n) for n in ("libtensorflow_framework.so.2",
                                              "libtensorflow_cc.so.2")
            if os.path.exists(os.path.join(folder, n))]


def our_libraries():
    return [_loader.library_path(), _core.__file__]


# auditwheel's manylinux_2_27 policy (Ubuntu 18.04, GCC 7): what cc/compat/abi_floor.h
# promises where TensorFlow's own wheel is older (TF 2.15: manylinux2014, whose GCC 4.8
# runtime lacks C++11 strings and sized delete).
MANYLINUX_2_27 = {"GLIBC": (2, 27), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11)}


def test_libraries_need_no_newer_glibc_or_libstdcxx_than_tensorflow_or_manylinux_2_27():
    floor = dict(MANYLINUX_2_27)
    for library in tensorflow_libraries():
        for name, version in required_versions(library).items():
            floor[name] = max(floor.get(name, version), version)
    assert tensorflow_libraries()
    for library in our_libraries():
        needed = required_versions(library)
        assert needed, library  # it was read at all
        for name, version in needed.items():
            assert version <= floor[name], (
                f"{os.path.basename(library)} needs {name}_{'.'.join(map(str, version))}, newer "
                f"than TensorFlow's own libraries and manylinux_2_27 "
                f"({name}_{'.'.join(map(str, floor[name]))}): "
                "pin or replace that symbol in cc/compat/abi_floor.{h,cc}")


def test_stand_ins_behave_as_the_libstdcxx_functions_they_replace():
    result = _core.abi_floor_self_test(copies=10000, count=4)
    assert result == {"stringstream": "fusedopt 42", "exception_ptr": "kept",
                      "destroyed_while_held": 0, "destroyed_after_release": 1,
                      "new_array": "allocated"}
    # new[] of a negative count: bad_array_new_length, a bad_alloc, caught as such.
    assert _core.abi_floor_self_test(copies=0, count=-1)["new_array"] == "bad_alloc"


def test_exception_ptr_references_are_counted_exactly():
    # Copies and releases of one exception_ptr: a reference too few frees the exception while
    # it is held, one too many never frees it; the exception counts its own destruction.
    for copies in (0, 1, 2, 1000, 1_000_000):
        result = _core.abi_floor_self_test(copies=copies, count=1)
        assert (result["exception_ptr"], result["destroyed_while_held"],
                result["destroyed_after_release"]) == ("kept", 0, 1), (copies, result)


@pytest.mark.parametrize("library", ["ops", "core"])
def test_stand_ins_are_not_exported(library):
    # Hidden: nothing we define may interpose on the process's libstdc++ for other libraries.
    path = _loader.library_path() if library == "ops" else _core.__file__
    out = subprocess.run([shutil.which("objdump") or "objdump", "-T", path],
                         capture_output=True, text=True, check=True).stdout
    for symbol in ("__libc_single_threaded", "_ZSt28__throw_bad_array_new_lengthv",
                   "_ZNSt15__exception_ptr13exception_ptr9_M_addrefEv",
                   "_ZNSt15__exception_ptr13exception_ptr10_M_releaseEv"):
        defined = [line for line in out.splitlines()
                   if line.endswith(symbol) and "*UND*" not in line]
        assert not defined, (library, defined)
