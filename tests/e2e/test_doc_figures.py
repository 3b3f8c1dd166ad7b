"""The site shows the figures its pages describe: docs/figures.py draws them from real runs at each build."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NEEDS_MKDOCS = "the site's build needs the [docs] extra (pip install -e '.[docs]')"
IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)")


def load_figures() -> ModuleType:
    """docs/figures.py, loaded as MkDocs loads a hook (it is no package's module)."""
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


figures = load_figures()


def prose(page: Path) -> str:
    """The page without its code (fenced blocks, inline spans), where an image is only shown as text."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M))


def embedded() -> dict[str, list[tuple[Path, str]]]:
    """Figure name -> (page, alt text) of every `![alt](figures/NAME.png)` in docs/*.md."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for m in IMAGE.finditer(prose(page)):
            assert m["src"].startswith("figures/") and m["src"].endswith(".png"), f"{page.name}: {m['src']}"
            found.setdefault(m["src"].removeprefix("figures/").removesuffix(".png"), []).append((page, m["alt"]))
    return found


def drawn() -> dict[str, tuple[figures.Job, figures.Analysis]]:
    return {name: (job, a) for job in figures.JOBS for a in job.analyses for name in a.figures}


def section_of(page: Path, name: str) -> str:
    """The text of the section (heading to heading, fenced blocks left out) of `page` that embeds figure `name`."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # a shell comment is no heading
    sections = re.split(r"^#{1,6} .*$", text, flags=re.M)
    return next(s for s in sections if f"](figures/{name}.png)" in s)


def test_every_figure_is_embedded_with_alt_text_and_every_embedded_image_is_drawn():
    pages = embedded()
    assert sorted(pages) == sorted(drawn())
    assert all(alt.strip() for places in pages.values() for _, alt in places)


def test_each_figure_is_next_to_the_commands_that_drew_it():
    """Its section gives every override of the job's runs and the analysis command: what it says drew it did."""
    for name, (job, analysis) in drawn().items():
        command = " ".join(["python -m analysis", *(f"runs/{run}" for run in job.runs), *analysis.options])
        for page, _ in embedded()[name]:
            text = re.sub(r"\s+", " ", section_of(page, name))
            wanted = [arg for args in job.runs.values() for arg in args] + [command]
            absent = [arg for arg in wanted if arg not in text]
            assert not absent, f"{page.name}, figure {name}: its section does not say {absent}"


def test_a_command_that_fails_stops_the_build_in_one_line(tmp_path, monkeypatch):
    PluginError = pytest.importorskip("mkdocs.exceptions", reason=NEEDS_MKDOCS).PluginError

    bad = figures.Job("bad", {"x": ("scenario=dropout.yaml", "dp.q=1.5")}, (figures.Analysis((), {"x": "gantt.png"}),))
    monkeypatch.setattr(figures, "JOBS", (bad,))
    with pytest.raises(PluginError) as e:
        figures.on_pre_build({"docs_dir": str(tmp_path / "docs"), "config_file_path": str(tmp_path / "mkdocs.yml")})
    message = str(e.value)
    assert "\n" not in message
    assert "job bad" in message and "exited 2" in message and "dp.q = 1.5" in message, message
    assert not (tmp_path / "docs" / "figures" / "x.png").exists()


def test_a_figure_no_job_draws_any_more_is_removed(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "gone.png").write_bytes(PNG_MAGIC)
    assert figures.build((), out, tmp_path / "work") == []
    assert list(out.iterdir()) == []


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.srcs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.srcs += [v for k, v in attrs if k == "src" and v]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built strictly from mkdocs.yml and the pages, into a temporary folder (figures and runs too).

    The runs of the repository's last build (build/figures/, make lint's in CI) are copied in as the cache:
    a job whose key (its commands, the sources' files) is unchanged is not run again."""
    pytest.importorskip("mkdocs", reason=NEEDS_MKDOCS)
    tmp = tmp_path_factory.mktemp("site")
    if (ROOT / "build" / "figures").is_dir():
        shutil.copytree(ROOT / "build" / "figures", tmp / "build" / "figures")
    shutil.copytree(ROOT / "docs", tmp / "docs", ignore=shutil.ignore_patterns("figures", "*.py", "__pycache__"))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config.update(docs_dir=str(tmp / "docs"), site_dir=str(tmp / "site"), hooks=[str(ROOT / "docs" / "figures.py")])
    (tmp / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp / "mkdocs.yml")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp


def test_the_built_site_shows_every_figure_on_its_pages(site):
    shown: set[Path] = set()
    for html in (site / "site").rglob("*.html"):
        parser = Images()
        parser.feed(html.read_text())
        for src in parser.srcs:
            image = (html.parent / src).resolve()
            assert image.is_file(), f"{html.relative_to(site)}: <img src={src}>: no such file"
            assert image.read_bytes().startswith(PNG_MAGIC) and image.stat().st_size > 5000, image
            shown.add(image)
    for name, places in embedded().items():
        for page, _ in places:
            html = site / "site" / page.stem / "index.html"
            assert f'src="../figures/{name}.png"' in html.read_text(), f"{html} does not show {name}"
    assert shown == {p.resolve() for p in (site / "site" / "figures").iterdir()}, "a figure drawn is not shown"


def test_a_build_with_nothing_changed_runs_nothing_and_rewrites_no_figure(site):
    out, work = site / "docs" / "figures", site / "build" / "figures"
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert figures.build(figures.JOBS, out, work) == []
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
