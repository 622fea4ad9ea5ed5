"""The documentation site (mkdocs.yml): it builds in strict mode, its API reference shows
every public name of the installed fusedopt with its signature and docstring, and a
browser renders it and finds it by search.

The site is built once (``mkdocs build --strict``, any warning fails the build) against the
fusedopt this test imports. The browser tests drive headless Chromium (Debian's
``chromium``, which tools/install_system_deps.sh installs) over the DevTools protocol; they
are skipped, saying why, only where Chromium is absent outside CI. The site is built with
the first TensorFlow stage's environment (tools/setup_env.sh installs docs/requirements.txt
there), hence ``once``.
"""
import functools
import html
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from chromium import Chromium, find_chromium

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow, pytest.mark.once]

# The API pages and the modules each documents (every name of the module's __all__).
API_PAGES = {
    "api/package": ["fusedopt"],
    "api/keras": ["fusedopt.keras", "fusedopt.keras.dtensor", "fusedopt.keras.migrate"],
    "api/keras-legacy": ["fusedopt.keras.legacy"],
    "api/compat-v1": ["fusedopt.compat.v1"],
    "api/estimator": ["fusedopt.estimator"],
    "api/checkpoint": ["fusedopt.checkpoint"],
    "api/reference": ["fusedopt.reference"],
    "api/runtime": ["fusedopt.runtime"],
    "api/info": ["fusedopt.info"],
}


def _missing(what, install):
    """Skips, saying why, on a developer's machine; fails in CI, which must have it."""
    message = f"{what} is not installed ({install})"
    if os.environ.get("CI"):
        pytest.fail(message + ": CI installs it, so this is a set-up error")
    pytest.skip(message)


def _env():
    """The test's environment, with the fusedopt this test imports first on PYTHONPATH."""
    import fusedopt

    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="2")
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(fusedopt.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_parent] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def mkdocs_build(config, site_dir, cwd):
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site_dir)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("mkdocs") is None:
        _missing("mkdocs", "pip install -r docs/requirements.txt; tools/setup_env.sh does")
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    proc = mkdocs_build(os.path.join(ROOT, "mkdocs.yml"), site_dir, ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # mkdocs' own warnings ("WARNING -  ..."); not what TensorFlow may print while the API
    # pages import it (absl's "WARNING: All log messages before absl::InitializeLog() ...").
    assert not re.search(r"^WARNING +-", proc.stderr, re.M), proc.stderr[-5000:]
    return site_dir


def page_text(site, page):
    with open(os.path.join(site, page, "index.html")) as f:
        return f.read()


def section(page, anchor):
    """The HTML of the API entry whose heading has id `anchor`, up to the next entry."""
    start = page.index(f'id="{anchor}"')
    own = page.index('class="doc doc-heading"', start)  # this entry's heading
    end = page.find('class="doc doc-heading"', own + 1)
    return page[start:end if end > 0 else len(page)]


def test_the_api_reference_shows_every_public_name(site):
    import importlib

    missing = []
    for page, modules in API_PAGES.items():
        text = page_text(site, page)
        for name in modules:
            module = importlib.import_module(name)
            names = getattr(module, "__all__", None)
            assert names, f"{name} has no __all__"
            missing += [f"{page}: {name}.{n}" for n in names if f'id="{name}.{n}"' not in text]
    assert not missing, missing
    ops = page_text(site, "api/ops")
    from fusedopt import ops as ops_module

    wrapper = re.compile(r"(resource_)?(sparse_|group_|packed_group_)?apply_\w+$")
    wrappers = [n for n in dir(ops_module) if wrapper.match(n)]
    assert len(wrappers) >= 36
    assert not [n for n in wrappers if f'id="fusedopt.ops.{n}"' not in ops]


def test_generated_classes_have_their_docstring_and_signature(site):
    """The Keras classes are made at import time and inherit Keras's constructor: the page
    shows each with its own docstring and the constructor Keras defines, plus fusedopt's
    keyword-only arguments."""
    import inspect

    import fusedopt.keras

    page = page_text(site, "api/keras")
    assert "Embedding" in fusedopt.keras.__all__  # the layer: its own section, no optimizer args
    assert "ResourceGather" in html.unescape(section(page, "fusedopt.keras.Embedding"))
    for name in (n for n in fusedopt.keras.__all__ if n != "Embedding"):
        entry = section(page, f"fusedopt.keras.{name}")
        text = html.unescape(re.sub(r"<[^>]+>", "", entry))
        first_line = inspect.getdoc(getattr(fusedopt.keras, name)).splitlines()[0]
        assert first_line.split("`")[0][:40] in text, (name, first_line)
        for argument in ("learning_rate", "slot_dtype", "stochastic_rounding"):
            assert argument in text, (name, argument)
    lazy_adam = re.sub(r"<[^>]+>", "", section(page, "fusedopt.keras.LazyAdam"))
    assert "beta_1" in lazy_adam and "lazy_weight_decay" in lazy_adam


def test_search_index_holds_the_api_entries(site):
    with open(os.path.join(site, "search", "search_index.json")) as f:
        index = json.load(f)
    locations = {doc["location"] for doc in index["docs"]}
    for anchor in ("api/keras/#fusedopt.keras.LazyAdam",
                   "api/compat-v1/#fusedopt.compat.v1.LazyAdamOptimizer",
                   "api/estimator/#fusedopt.estimator.replicate_model_fn",
                   "guides/keras/#the-swap"):
        assert anchor in locations, anchor


def test_strict_mode_fails_on_a_docstring_it_cannot_parse(tmp_path):
    """The same configuration (INHERIT) on a one-page site documenting a module whose
    ``Args:`` entry lacks its colon: the build fails naming it; fixed, it builds."""
    if importlib.util.find_spec("mkdocs") is None:
        _missing("mkdocs", "pip install -r docs/requirements.txt; tools/setup_env.sh does")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# API\n\n::: sample_module\n")
    (tmp_path / "tools").mkdir()
    shutil.copy(os.path.join(ROOT, "tools", "griffe_runtime_signatures.py"), tmp_path / "tools")
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {os.path.join(ROOT, 'mkdocs.yml')}\ndocs_dir: docs\nnav: [index.md]\n")
    module = textwrap.dedent('''\
        """A module."""

        __all__ = ["scale"]


        def scale(x: float) -> float:
            """Doubles x.

            Args:
                x{colon} the value.
            """
            return 2 * x
        ''')
    results = {}
    for colon in ("", ":"):
        (tmp_path / "sample_module.py").write_text(module.format(colon=colon))
        env = _env()
        env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
        results[colon] = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict",
             "--site-dir", str(tmp_path / "site")],
            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    broken, fixed = results[""], results[":"]
    assert broken.returncode != 0, broken.stderr[-3000:]
    assert "Failed to get 'name: description' pair from 'x the value.'" in broken.stderr
    assert "strict mode" in broken.stdout + broken.stderr
    assert fixed.returncode == 0, fixed.stderr[-3000:]


# --- in a browser ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (search loads its index with fetch)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = find_chromium()
    if binary is None:
        _missing("Chromium", "apt-get install chromium; tools/install_system_deps.sh does")
    chromium = Chromium(binary, tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


def test_the_api_page_renders_the_classes(browser, served):
    browser.open(served + "/api/keras/")
    text = browser.wait_for(
        "document.getElementById('fusedopt.keras.LazyAdam') && "
        "document.getElementById('fusedopt.keras.LazyAdam').closest('.doc-class').innerText")
    assert text, "no fusedopt.keras.LazyAdam entry on the rendered page"
    assert "LazyAdam(learning_rate=0.001,beta_1=0.9" in re.sub(r"\s+", "", text)
    assert "sparse gradients update only the rows they touch" in text
    headings = browser.evaluate(
        "Array.from(document.querySelectorAll('h2.doc-heading')).map(h => h.id)")
    wanted = {"fusedopt.keras.%s" % n for n in ("LazyAdam", "Adagrad", "RowWiseAdagrad")}
    assert wanted <= set(headings), headings
    # The theme's script ran (it builds the navigation drawer and the search box).
    assert browser.evaluate("!!document.querySelector('[data-md-component=search-query]')")


RESULT_LINKS = ("Array.from(document.querySelectorAll('.md-search-result__link'))"
                ".map(a => a.getAttribute('href'))")


def test_search_finds_the_class(browser, served):
    browser.open(served + "/?q=LazyAdam")
    links = browser.wait_for(RESULT_LINKS + ".filter(h => h.includes('LazyAdam'))")
    assert links and any(re.search(r"/api/keras/(\?h=\w+)?#fusedopt\.keras\.LazyAdam$", h)
                         for h in links), links
    # The check can fail: a word in no page finds nothing.
    browser.open(served + "/?q=qzxwvuts")
    meta = browser.wait_for("(m => m && !m.startsWith('Initializing') ? m : null)("
                            "(document.querySelector('.md-search-result__meta') || {}).innerText)")
    assert meta and "No matching documents" in meta, meta
    assert browser.evaluate(RESULT_LINKS) == []
