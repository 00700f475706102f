"""The documentation site: it builds strictly, documents every public name, and renders.

* ``mkdocs build --strict`` (no broken link or anchor, no missing API reference, no bad
  docstring section) into a temporary build folder, once for this file; skipped when the
  ``docs`` extra is not installed. ``JAXDYN_DOCS_SITE=DIR`` uses a site already built there
  (``.ci/run`` builds it once and runs this file on it).
* Every public name (``__all__`` of ``jaxdyn`` and of each subpackage, less the CLI helpers of
  ``hooks.NOT_API``) has its entry in the API pages, no other name has one, and every constant
  has a description.
* The maths page has no code block, typeset maths in every section and every heading in its
  contents.
* Headless Chromium (Debian's ``chromium``) opens the home page, one guide and one API page
  from a local HTTP server and checks that their figures load and their equations are typeset
  by MathJax (no TeX source left, no MathJax error); a screenshot of each is saved in the build
  folder (``screenshots/``). Skipped when no browser is found (under ``CI=true`` as root,
  ``apt-get install -y chromium`` is tried first).
"""

from __future__ import annotations

import functools
import http.server
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the API pages' list of subpackages and names)

sys.path.remove(str(ROOT / "docs"))

PAGES = {"home": "", "guide": "guides/density/", "api": "api/kernels/"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if os.environ.get("JAXDYN_DOCS_SITE"):
        return Path(os.environ["JAXDYN_DOCS_SITE"])
    try:
        importlib.import_module("mkdocs")
        importlib.import_module("mkdocstrings")
        importlib.import_module("material")
    except ImportError:
        pytest.skip('the docs extra is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp("docs-build") / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return out


def test_site_builds_strictly(site):
    for page in ["index.html", "math/index.html", "layout/index.html",
                 "reproductions/index.html", "benchmarks/index.html",
                 "guides/config-reference/index.html"]:
        assert (site / page).exists(), page
    for sub in hooks.SUBPACKAGES:
        assert (site / "api" / sub / "index.html").exists(), sub


def _ids(html):
    return set(re.findall(r'id="(jaxdyn\.[\w.]+)"', html))


def test_every_public_name_has_an_api_entry(site):
    missing = []
    for sub in hooks.SUBPACKAGES:
        ids = _ids((site / "api" / sub / "index.html").read_text())
        public = hooks.public_names(f"jaxdyn.{sub}")
        missing += [f"jaxdyn.{sub}.{n}" for n in public if f"jaxdyn.{sub}.{n}" not in ids]
    top = (site / "api" / "jaxdyn" / "index.html").read_text()
    all_ids = set().union(*(_ids((site / "api" / s / "index.html").read_text())
                            for s in hooks.SUBPACKAGES), _ids(top))
    for name in hooks.public_names("jaxdyn"):
        where = hooks.documented_at(name) or f"jaxdyn.{name}"
        if where not in all_ids or f"<code>{name}</code>" not in top:
            missing.append(f"jaxdyn.{name}")
    assert not missing, missing


def test_api_pages_list_exactly_the_public_names(site):
    """Each subpackage page has one entry per public name and no other module-level entry."""
    wrong = {}
    for sub in hooks.SUBPACKAGES:
        ids = _ids((site / "api" / sub / "index.html").read_text())
        entries = {i.split(".")[2] for i in ids if i.count(".") == 2}
        if entries != set(hooks.public_names(f"jaxdyn.{sub}")):
            wrong[sub] = sorted(entries ^ set(hooks.public_names(f"jaxdyn.{sub}")))
    assert not wrong, wrong


def test_every_public_constant_is_described(site):
    """Every module attribute on the API pages has a description (its #: comment or docstring)."""
    bare = []
    for sub in hooks.SUBPACKAGES:
        html = (site / "api" / sub / "index.html").read_text()
        for m in re.finditer(r'<div class="doc doc-object doc-attribute">(.*?)'
                             r'(?=<div class="doc doc-object |\Z)', html, flags=re.S):
            name = re.search(r'id="(jaxdyn\.[\w.]+)"', m.group(1))
            contents = re.search(r'class="doc doc-contents[^"]*">(.*)', m.group(1), flags=re.S)
            text = re.sub(r"<[^>]+>", " ", contents.group(1) if contents else "").strip()
            if name and name.group(1).count(".") == 2 and not text:
                bare.append(name.group(1))
    assert not bare, bare


def test_not_api_names_are_exported_and_unused_by_the_docs():
    """The names left off the pages are in their __all__ (the list cannot go stale) and no page
    or README tells a user to call them."""
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    pages += (ROOT / "README.md").read_text()
    for sub, names in hooks.NOT_API.items():
        module = importlib.import_module(f"jaxdyn.{sub}")
        for name in names:
            assert name in module.__all__, (sub, name)
            assert not re.search(rf"\b{name}\b", pages), (sub, name)


def test_math_page_is_typeset_in_every_section(site):
    """docs/math.md: no code block (the formulas are LaTeX, typeset by arithmatex and MathJax),
    inline math in every section A–H, and every heading in the page's contents and sidebar."""
    html = (site / "math" / "index.html").read_text()
    article = html.split('<article class="md-content__inner', 1)[1]
    assert "<pre" not in article
    sections = re.split(r'<h2 id="', article)[1:]
    assert [s[0] for s in sections[:8]] == list("abcdefgh"), [s[:12] for s in sections]
    for s in sections[:8]:
        assert s.count('class="arithmatex"') >= 3, s[:60]
    heads = re.findall(r'<h[2-4] id="([^"]+)"', article)
    toc = re.search(r'<div class="toc">(.*?)</div>', article, flags=re.S).group(1)
    side = html[html.index("md-sidebar--secondary"):html.index("md-content")]
    for where in (toc, side):
        listed = set(re.findall(r'href="#([^"]+)"', where))
        assert set(heads) <= listed, sorted(set(heads) - listed)
    # no formula left in Unicode inside backticks: a code span with maths symbols must name
    # code (a call, a keyword argument or an identifier with an underscore)
    source = (ROOT / "docs" / "math.md").read_text()
    for span in re.findall(r"`([^`\n]+)`", source):
        if re.search(r"[⟨⟩‖∫Σᵀ√≤≥∝→↦]", span):
            assert re.search(r"\w\(|=\w|_[a-z]{2}", span), span


def test_dir_matches_all():
    """dir() of each subpackage holds no public name that its __all__ (the API pages) omits."""
    leaks = {}
    for sub in hooks.SUBPACKAGES:
        module = importlib.import_module(f"jaxdyn.{sub}")
        public = {n for n in dir(module) if not n.startswith("_") and n != "annotations"
                  and not isinstance(getattr(module, n), types.ModuleType)}  # (a __future__ flag)
        if extra := sorted(public - set(module.__all__)):
            leaks[sub] = extra
    assert not leaks, leaks


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if (os.environ.get("CI") == "true" and shutil.which("apt-get") and hasattr(os, "geteuid")
            and os.geteuid() == 0):
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], capture_output=True,
                       timeout=900, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        return shutil.which("chromium")
    return None


# Appended to a copy of each page: once MathJax and the fonts are ready, the page writes what
# it shows into a <pre id="jaxdyn-check"> that --dump-dom returns.
CHECK_SCRIPT = """
<script>
window.addEventListener("load", async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  const imgs = [...document.querySelectorAll("article img")];
  const spans = [...document.querySelectorAll("article .arithmatex")];
  const out = {
    math: document.querySelectorAll("article mjx-container").length,
    math_errors: document.querySelectorAll("mjx-merror").length,
    untypeset: spans.filter((e) => !e.querySelector("mjx-container")).length,
    fonts: [...document.fonts].filter((f) => f.status === "loaded" && /MJX/.test(f.family)).length,
    images: imgs.length,
    images_loaded: imgs.filter((i) => i.complete && i.naturalWidth > 0).length,
  };
  const pre = document.createElement("pre");
  pre.id = "jaxdyn-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


_BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--no-first-run", "--window-size=1280,1600")


def _chromium(browser, profile, *args):
    # Headless Chromium now and then never exits (seen on a fresh profile, on a page it rendered
    # the time before): one more try in a fresh profile before the test fails, so that a hung
    # browser is not reported as a broken page.
    cmd = [browser, *_BROWSER_FLAGS, *args]
    try:
        return subprocess.run([*cmd, f"--user-data-dir={profile}"], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return subprocess.run([*cmd, f"--user-data-dir={profile}-retry"], capture_output=True,
                              text=True, timeout=120)


def _screenshot(browser, profile, shot, url, tries=3, wait=45.0):
    """Chromium's ``--screenshot`` of ``url`` into ``shot``; returns the browser's stderr tail.

    The page is given a virtual-time budget (``--timeout``, the wall-clock form, left about one
    headless run in three hanging before it wrote the file on this machine's Chromium; the
    virtual budget none of 23). The browser runs in its own process group, is
    stopped once the file has been written and its size has held for half a second, and is
    tried again in a fresh profile (``tries`` times, ``wait`` seconds each) when no file came.
    """
    import signal
    import time

    err = ""
    for attempt in range(tries):
        shot.unlink(missing_ok=True)
        log = profile.parent / f"{profile.name}-{attempt}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [browser, *_BROWSER_FLAGS, "--virtual-time-budget=5000", f"--screenshot={shot}", url,
                 f"--user-data-dir={profile}-{attempt}"],
                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            start, size, since = time.monotonic(), -1, None
            while time.monotonic() - start < wait:
                exited = proc.poll() is not None
                now = shot.stat().st_size if shot.exists() else -1
                if now > 0 and now == size:
                    if exited or time.monotonic() - since >= 0.5:
                        break
                elif now != size:
                    size, since = now, time.monotonic()
                if exited and now <= 0:
                    break
                time.sleep(0.1)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err = log.read_text()[-2000:]
        if shot.exists() and shot.stat().st_size > 0:
            return err
    return err


def test_pages_render_figures_and_equations(site, server, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser (Debian's chromium package) on this machine")
    shots = site.parent / "screenshots"
    shots.mkdir(exist_ok=True)
    for name, page in PAGES.items():
        html = (site / page / "index.html").read_text()
        (site / page / "check.html").write_text(html.replace("</body>", CHECK_SCRIPT + "</body>"))
        p = _chromium(browser, tmp_path / f"profile-{name}", "--virtual-time-budget=15000",
                      "--dump-dom", server + page + "check.html")
        m = re.search(r'<pre id="jaxdyn-check">(.*?)</pre>', p.stdout)
        assert m, (name, p.stderr[-2000:])
        seen = json.loads(m.group(1))
        assert seen["math"] >= 1 and seen["untypeset"] == 0 and seen["math_errors"] == 0, (name, seen)
        assert seen["fonts"] >= 1, (name, seen)
        assert seen["images_loaded"] == seen["images"], (name, seen)
        if name != "api":
            assert seen["images"] >= 1, (name, seen)
        shot = shots / f"{name}.png"
        err = _screenshot(browser, tmp_path / f"profile-{name}-shot", shot, server + page)
        assert shot.exists() and shot.stat().st_size > 50_000, (name, shot, err)


def _python_blocks(page):
    text = page.read_text()
    for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        # the included examples run in tests/test_examples.py; the results-file block in
        # tests/test_readme.py (it reads the quick start's run folder)
        if "--8<--" not in m.group(1) and "runs/default" not in m.group(1):
            yield text[: m.start()].count("\n") + 1, m.group(1)


@pytest.mark.docs
def test_docs_python_blocks_run(tmp_path, monkeypatch):
    """Every python block written in a docs page (not an included example) runs as written.

    The float64 blocks of the home page and the guides run in a fresh interpreter
    (tests/test_newcomer_docs_blocks.py, x64 off at their start); not again here. Marked
    ``docs``: run by ``-m docs`` (CI's documentation step), not by the default suite.
    """
    import matplotlib
    from test_newcomer_docs_blocks import PAGES as FRESH_INTERPRETER_PAGES

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    ran = 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        ns: dict = {}
        for line, code in _python_blocks(page):
            if page in FRESH_INTERPRETER_PAGES and "float64" in code:
                continue
            exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), ns)  # noqa: S102
            ran += 1
    assert ran >= 3


def test_docs_commands_parse_and_resolve(capsys):
    """Every `jaxdyn ...` line of the docs' bash blocks parses; every config it runs resolves."""
    import shlex

    from jaxdyn import cli
    from jaxdyn.encoder_host import find_minilm

    try:
        find_minilm()
        minilm = True
    except FileNotFoundError:
        minilm = False
    checked = 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for m in re.finditer(r"^```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M):
            for line in re.sub(r"\\\n\s*", " ", m.group(1)).splitlines():  # continuations joined
                words = shlex.split(line.split("#", 1)[0].rstrip(" &"))
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value prefixes
                if words[:1] == ["srun"]:
                    words = words[1:]
                if words[:1] != ["jaxdyn"]:
                    continue
                args = words[1:]
                try:
                    cli.build_parser().parse_args(args)
                except SystemExit:
                    pytest.fail(f"{page.relative_to(ROOT)}: `{line}` does not parse: "
                                f"{capsys.readouterr().err}")
                configs = [a for a in args if a.startswith("configs/")]
                if configs and (minilm or "minilm" not in configs[0]):
                    sets = [x for i, x in enumerate(args) if i and args[i - 1] == "--set"]
                    rc = cli.main(["config", str(ROOT / configs[0]),
                                   *[w for s in sets for w in ("--set", s)]])
                    assert rc == 0, (page, line, capsys.readouterr().err)
                for path in re.findall(r"\b((?:configs|examples)/[\w./-]+)", line):
                    assert (ROOT / path).exists(), (page, path)
                checked += 1
    assert checked >= 20
