"""The README as a landing page, and the documents around it.

Checked: the README's length and what its first screen holds (the two set-up commands, the
Keras swap), that CI runs the README's test command, that its results table is
BENCHMARKS.md's headline table (one set of figures), that every link of the README and
CONTRIBUTING.md resolves, that the facts moved to CONTRIBUTING.md are there, that every
documentation page is in the site's navigation, and that no user document names an
issue or uses internal words. Plain file reads: no TensorFlow.
"""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(*path):
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def marked_section(text, name):
    """The text between ``--8<-- [start:name]`` and ``--8<-- [end:name]`` (snippet markers)."""
    match = re.search(r"--8<-- \[start:%s\] -->\n(.*?)<!-- --8<-- \[end:%s\]" % (name, name),
                      text, re.S)
    assert match, f"no section {name!r}"
    return match.group(1)


def test_readme_is_a_landing_page():
    lines = read("README.md").splitlines()
    assert len(lines) <= 150, len(lines)
    first_screen = "\n".join(lines[:60])
    assert "bash tools/run_demo.sh" in first_screen
    assert "bash tools/test_all.sh" in first_screen
    assert "fusedopt.keras.LazyAdam(" in first_screen  # the one-line swap
    assert "![" in read("README.md") and "docs/bench/benchmarks.png" in read("README.md")
    assert os.path.exists(os.path.join(ROOT, "docs", "bench", "benchmarks.png"))


def test_ci_runs_the_readmes_test_command():
    run = read(".ci", "run")
    commands = [line.split("exec ", 1)[1].strip() for line in run.splitlines()
                if line.startswith("exec ")]
    assert commands == ["bash tools/test_all.sh"], commands
    assert re.search(r"^bash tools/test_all\.sh\b", read("README.md"), re.M)


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_readmes_results_are_benchmarks_headline_table():
    readme = table_rows(marked_section(read("README.md"), "results"))
    benchmarks = table_rows(marked_section(read("BENCHMARKS.md"), "summary"))
    assert len(readme) >= 10 and readme == benchmarks
    header = readme[0].lower()
    assert "recorded" in header
    body = "\n".join(readme)
    for peer in ("keras.optimizers.Adam", "tf.compat.v1.train.AdamOptimizer", "SparseAdam",
                 "FBGEMM", "floor"):
        assert peer in body, peer
    # Every row names its date and machine.
    assert all(re.search(r"\| 2026-\d\d-\d\d, (AMD EPYC|Intel)", row) for row in readme[2:]), readme


@pytest.mark.parametrize("document", ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md"])
def test_relative_links_resolve(document):
    text = read(document)
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if "://" not in link
               and not os.path.exists(os.path.join(ROOT, link))]
    assert not missing, missing


def test_contributing_keeps_the_facts_moved_from_the_readme():
    text = read("CONTRIBUTING.md")
    for fact in ("-n 2 --dist loadfile", "About 45 minutes on 2 cores",
                 "once", '-m "not slow and not large" tests', "FUSEDOPT_WERROR=1",
                 "FUSEDOPT_JOBS", "auditwheel", "tools/check_wheel.sh", "cc/compat/abi_floor.h",
                 "tools/test_matrix.sh", "FUSEDOPT_GPU_STANDIN=1", "GPU_CHECK_BUDGET_S",
                 "tools/bazel_build.sh", "ASan+UBSan", "MANIFEST.in", "mkdocs build --strict"):
        assert fact in text, fact


def doc_pages():
    pages = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "docs")):
        pages += [os.path.relpath(os.path.join(dirpath, f), os.path.join(ROOT, "docs"))
                  for f in files if f.endswith(".md")]
    return sorted(pages)


def test_every_documentation_page_is_in_the_navigation():
    nav = read("mkdocs.yml").split("\nnav:", 1)[1].split("\nexclude_docs:", 1)[0]
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", nav, re.M))
    assert set(doc_pages()) == listed, (sorted(set(doc_pages()) - listed),
                                        sorted(listed - set(doc_pages())))


def user_documents():
    files = ["README.md", "BENCHMARKS.md", "CONTRIBUTING.md", "mkdocs.yml"]
    files += [os.path.join("docs", page) for page in doc_pages()]
    files += [os.path.join("examples", f)
              for f in sorted(os.listdir(os.path.join(ROOT, "examples"))) if f.endswith(".py")]
    return files


# An issue named by number (issue 18, issues 32, 33, issue-33, #33, owner/repo#2807), and
# words of the project's internal planning.
INTERNAL = re.compile(r"\bissues?[ -]?#?\d+|(?<![\w&])#\d+\b|\w/\w+#\d+|\bmoonshot|"
                      r"\bthis session\b|\bitems? \d+\b", re.I)


@pytest.mark.parametrize("path", user_documents())
def test_user_documents_name_no_issue(path):
    found = [m.group(0) for m in INTERNAL.finditer(read(path))]
    assert not found, found


def test_the_internal_words_check_can_fail():
    for text in ("issue 33", "issues 32, 33", "the issue-33 aim", "moonshot 10x",
                 "tensorflow/addons#2807", "item 3, after item 1", "see #18"):
        assert INTERNAL.search(text), text
    for text in ("Issue a warning", "a v1 Session", "HTTP/1.1", "x86-64", "&#39;"):
        assert not INTERNAL.search(text), text
