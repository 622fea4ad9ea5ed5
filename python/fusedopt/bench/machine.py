"""This machine's CPU in words, for every record the benchmark writes: a memory-bound step's
time, and its ratio to the floor, depend on the CPU and its caches as much as on the code,
so each report names them beside its figures.

Read from Linux's /proc/cpuinfo and /sys/devices/system/cpu (elsewhere: what ``platform``
says, caches unknown).
"""
import os
import platform

CPUINFO = "/proc/cpuinfo"
CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
# The vector instructions the engine's loops can use (cc/core/cpu_isa.h), most capable first.
VECTOR_FLAGS = ("avx512f", "avx2", "sse4_2")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_model(cpuinfo=CPUINFO):
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."), or platform's guess."""
    fields = _cpuinfo_fields(cpuinfo)
    return fields.get("model name") or platform.processor() or platform.machine() or None


def vector_isa(cpuinfo=CPUINFO):
    """The widest of VECTOR_FLAGS the CPU lists, or None."""
    flags = set(_cpuinfo_fields(cpuinfo).get("flags", "").split())
    return next((flag for flag in VECTOR_FLAGS if flag in flags), None)


def _cpuinfo_fields(cpuinfo):
    """The first processor's fields of /proc/cpuinfo ({} when there is none)."""
    fields = {}
    for line in (_read(cpuinfo) or "").splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _size_bytes(text):
    """sysfs's cache size ("32K", "32768K", "1M") in bytes, or None."""
    text = (text or "").strip()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if text and text[-1].upper() in units:
            return int(text[:-1]) * units[text[-1].upper()]
        return int(text)
    except ValueError:
        return None


def _cpus_in(cpu_list):
    """How many CPUs a sysfs list ("0-1", "0,4", "3") names, or None."""
    count = 0
    try:
        for part in (cpu_list or "").strip().split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
    except ValueError:
        return None
    return count or None


def caches(cache_dir=CACHE_DIR):
    """The first CPU's data and unified caches, smallest level first: dicts of level (1, 2,
    3), name ("L1d", "L2", "L3"), bytes and shared_by (CPUs sharing it, when known)."""
    found = []
    try:
        entries = sorted(os.listdir(cache_dir))
    except OSError:
        return found
    for entry in entries:
        if not entry.startswith("index"):
            continue
        here = os.path.join(cache_dir, entry)
        kind = (_read(os.path.join(here, "type")) or "").strip()
        level = (_read(os.path.join(here, "level")) or "").strip()
        size = _size_bytes(_read(os.path.join(here, "size")))
        if kind == "Instruction" or not level.isdigit() or size is None:
            continue
        found.append({"level": int(level), "name": f"L{level}" + ("d" if kind == "Data" else ""),
                      "bytes": size,
                      "shared_by": _cpus_in(_read(os.path.join(here, "shared_cpu_list")))})
    return sorted(found, key=lambda c: c["level"])


def _bytes_words(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def describe(cpuinfo=CPUINFO, cache_dir=CACHE_DIR):
    """{"model", "vector_isa", "caches"} and "words": the CPU in one line, e.g.
    "AMD EPYC, avx2; caches L1d 32 KiB, L2 512 KiB, L3 32 MiB (shared by 2 CPUs)"."""
    model, isa, found = cpu_model(cpuinfo), vector_isa(cpuinfo), caches(cache_dir)
    words = model or "CPU model unknown"
    if isa:
        words += f", {isa}"
    if found:
        words += "; caches " + ", ".join(
            f"{c['name']} {_bytes_words(c['bytes'])}"
            + (f" (shared by {c['shared_by']} CPUs)" if (c["shared_by"] or 1) > 1 else "")
            for c in found)
    else:
        words += "; cache sizes unknown"
    return {"model": model, "vector_isa": isa, "caches": found, "words": words}


def machine_words():
    """The "machine" of every record: architecture, cores, and the CPU with its caches."""
    return f"{platform.machine()}, {os.cpu_count()} cores, {describe()['words']}"
