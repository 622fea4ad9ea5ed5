"""Every rule's element loop compiles to vector instructions in the engine's AVX2 clone.

The compiler decides that silently: a loop it cannot prove free of overlapping pointers
stays scalar, and the step then runs several times slower with the same results (centered
RMSprop, the one rule with three slots, did: 0.45x TensorFlow's own kernel). So this reads
the built code: the AVX2 clone of each rule's float32 update (fusedopt._core, the same
engine headers as the op library) must hold packed single-precision arithmetic on 256-bit
registers.
"""
import platform
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the AVX2 clones exist on x86-64 only")

# UpdateSpanAvx2<Rule, T, S, G, kStochastic>: float32 var, slots and gradient, rounding to
# nearest (the clone every float32 dense and sparse step runs on an AVX2 CPU).
CLONE = re.compile(r"UpdateSpanAvx2<fusedopt::(.+), float, float, float, false>\(")
PACKED = re.compile(r"\bv(mul|add|sub|div|sqrt)ps\b.*%ymm")


def float32_clones(library):
    """{rule's C++ type: mangled symbol} of the AVX2 clones in the library."""
    symbols = subprocess.run(["nm", library], capture_output=True, text=True,
                             check=True).stdout.split()
    mangled = [s for s in symbols if "UpdateSpanAvx2" in s]
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True,
                               text=True, check=True).stdout.splitlines()
    return {m.group(1): symbol for symbol, name in zip(mangled, demangled)
            if (m := CLONE.search(name))}


def packed_instructions(library, symbol):
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={symbol}",
                              library], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if PACKED.search(line)]


def test_every_rules_float32_loop_is_vectorised():
    from fusedopt import _core
    for tool in ("nm", "c++filt", "objdump"):
        assert shutil.which(tool), f"{tool} (binutils) is needed to read the built loops"
    clones = float32_clones(_core.__file__)
    assert len(clones) == len(_core.rules()), sorted(clones)  # one per rule
    scalar = sorted(rule for rule, symbol in clones.items()
                    if not packed_instructions(_core.__file__, symbol))
    assert not scalar, f"element loops left scalar by the compiler: {scalar}"
