"""The benchmark names the CPU and its caches beside its figures (fusedopt.bench.machine),
and its floor aims name them too: a memory-bound ratio means nothing without the machine."""
import pytest

from fusedopt.bench import aims, machine

XEON_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw

processor\t: 1
model name\t: Another model, never read
flags\t\t: fpu
"""


def fake_caches(root, entries):
    """entries: (index, level, type, size, shared_cpu_list) under root/indexN."""
    for index, level, kind, size, shared in entries:
        d = root / f"index{index}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "shared_cpu_list").write_text(f"{shared}\n")
    return str(root)


def test_describes_model_widest_vector_isa_and_data_caches(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(XEON_CPUINFO)
    caches = fake_caches(tmp_path / "cache", [
        (0, 1, "Data", "48K", "0-1"), (1, 1, "Instruction", "32K", "0-1"),
        (2, 2, "Unified", "2048K", "0-1"), (3, 3, "Unified", "107520K", "0,2-7")])
    cpu = machine.describe(str(cpuinfo), caches)
    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8488C"
    assert cpu["vector_isa"] == "avx512f"
    assert [(c["name"], c["bytes"], c["shared_by"]) for c in cpu["caches"]] == [
        ("L1d", 48 << 10, 2), ("L2", 2 << 20, 2), ("L3", 105 << 20, 7)]
    assert cpu["words"] == ("Intel(R) Xeon(R) Platinum 8488C, avx512f; caches "
                            "L1d 48 KiB (shared by 2 CPUs), L2 2 MiB (shared by 2 CPUs), "
                            "L3 105 MiB (shared by 7 CPUs)")


def test_unreadable_or_damaged_sources_still_give_words(tmp_path):
    caches = fake_caches(tmp_path / "cache", [(0, 1, "Data", "lots", "0"),
                                               (1, "x", "Unified", "1M", "0"),
                                               (2, 2, "Unified", "1M", "garbage")])
    cpu = machine.describe(str(tmp_path / "no_cpuinfo"), caches)
    assert cpu["vector_isa"] is None
    assert [(c["name"], c["shared_by"]) for c in cpu["caches"]] == [("L2", None)]
    assert cpu["words"].endswith("; caches L2 1 MiB")
    nothing = machine.describe(str(tmp_path / "no_cpuinfo"), str(tmp_path / "no_cache"))
    assert nothing["caches"] == [] and nothing["words"].endswith("; cache sizes unknown")


def test_this_machine_is_named_with_its_cores():
    words = machine.machine_words()
    assert " cores, " in words
    cpu = machine.describe()
    assert cpu["words"] in words


def test_floor_aims_cover_every_rule_at_1_3_and_name_the_cpu():
    def row(x):
        return {"x_fusedopt": x}
    sparse = {"lazy_adam": {"tf.keras Adam": row(50.0), "_meta": {"fusedopt_in_step_x_floor": 1.1,
                                                                   "fusedopt_x_floor": 1.9}},
              "adagrad": {"TF ResourceSparseApplyAdagradV2 (+dedup)": row(4.0),
                          "_meta": {}},  # not measured: no verdict
              "row_wise_adagrad": {"_meta": {"fusedopt_in_step_x_floor": 2.0}},
              # this run's form: the best call against the best probe is the aim
              "rms_prop": {"_meta": {"fusedopt_in_step_x_floor": 1.5,
                                     "fusedopt_in_step_best_x_floor": 1.2}}}
    cpu = machine.describe()
    found = [r for r in aims.aims({"sparse": sparse, "environment": {"cpu": cpu}})
             if "the floor" in r["aim"]]
    on = f" on {cpu['words']}"
    assert found == [
        aims.aim(f"sparse lazy_adam op in a training step / the floor{on}", 1.1, 1.3, at_most=True),
        aims.aim(f"sparse adagrad op in a training step / the floor{on}", None, 1.3, at_most=True),
        aims.aim(f"sparse row_wise_adagrad op in a training step / the floor{on}", 2.0, 1.3, at_most=True),
        aims.aim(f"sparse rms_prop op in a training step / the floor{on}, best of each", 1.2, 1.3,
                 at_most=True)]
    assert [r["met"] for r in found] == [True, None, False, True]
    # An earlier run's results (no "cpu" recorded): the rows, without a CPU.
    assert aims.sparse_aims(sparse)[-2]["aim"] == "sparse row_wise_adagrad op in a training step / the floor"


@pytest.mark.parametrize("text,expected", [("32K", 32 << 10), ("1M", 1 << 20), ("512", 512),
                                           ("", None), ("K", None), ("12Q", None)])
def test_cache_size_words(text, expected):
    assert machine._size_bytes(text) == expected


def test_the_table_size_aims_compare_the_two_largest_tables_per_touched_row():
    # 10M rows at 12 ms touching 99,500 distinct rows, 1M rows at 10 ms touching 95,000:
    # per touched row (12 / 99,500) / (10 / 95,000). The smallest table is not compared.
    scaling = {"table_rows": {"100000": 3.0, "1000000": 10.0, "10000000": 12.0},
               "table_rows_xla": {"XLA, custom call": {"1000000": 8.0, "10000000": 16.0}},
               "distinct_ids": {"100000": 63_000, "1000000": 95_000, "10000000": 99_500}}
    rows = aims.scaling_aims(scaling)
    assert [r["aim"] for r in rows] == [
        "step per touched row at 10,000,000 table rows / at 1,000,000 (tf.function)",
        "step per touched row at 10,000,000 table rows / at 1,000,000 (XLA, custom call)"]
    assert rows[0]["value"] == pytest.approx(12 / 99_500 / (10 / 95_000))
    assert rows[1]["value"] == pytest.approx(16 / 99_500 / (8 / 95_000))
    assert [r["met"] for r in rows] == [True, False]
    del scaling["distinct_ids"]  # an earlier run's results: per step, said so
    assert aims.scaling_aims(scaling)[0]["aim"].startswith("step time at 10,000,000")
