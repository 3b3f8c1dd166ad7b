"""Every shell and Python snippet in README.md and docs/*.md runs and exits 0 (issue 33, item 1).

The rules a page's author writes to:

* A fenced block tagged `bash`, `sh` or `shell` runs under bash with `set -euo pipefail`; one tagged
  `python` runs in a fresh interpreter (`python -c`, so the current directory is importable, as at a
  prompt). Each runs in a fresh temporary directory, which is its current directory (where runs/
  lands), with the repository first on PYTHONPATH and `python` on PATH being this interpreter.
* A block tagged `text` is shown output, a synopsis or a diagram, and never runs. Every fence has
  one of these tags, so that nothing meant to run is passed over.
* A marker is an HTML comment on a line of its own right before the fence (several may stand one
  above the other): `<!-- snippet: ACTION [ARGS] (reason) -->`. The reason is compulsory.
  - `skip (reason)`: not run, only where it truly cannot run here (outside infrastructure, an
    install into the environment, the test suite itself).
  - `append ARGS (reason)`: ARGS go at the end of every `python -m` command of the block, to
    shorten one that is intrinsically long (`--rounds 1`, `budget.rounds=2`); a later value of the
    same key or option wins.
  - `continue (reason)`: the block runs after the page's previous run block, in its directory (it
    reads what that one wrote). A block and the ones that continue it are one test, in page order.
  - `file NAME (reason)`: the block is written to NAME in its directory instead of being run (a
    user's policy module); the next block to run must `continue` it.
  - `needs NAME... (reason)`: the block is skipped when a NAME is missing: a module that is not importable
    (an optional extra that `make test` does not install) or a built-in dataset read from files
    (nodes/data/catalog.py) that is not installed (`fashion_mnist`); the blocks that continue it must
    not read what it wrote.
  - `ray-head (reason)`: run with RAY_ADDRESS naming a Ray head node this module starts on this
    machine, as `ray start --head` would give one, in the xdist group of the other Ray tests.
* Port 5555 (`:5555`) in a run block is replaced by a free port, so that parallel runs never meet.
* A run block that runs the test suite (`make test`, `pytest`) must be skipped: "this is the test suite".

Each chain of blocks is one test, so xdist spreads them; a chain that repeats an earlier one exactly
(the README's example shown again in its page) runs once. README.md's relative links are checked
here (mkdocs checks docs/ but never reads the README).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nodes.data import DATASETS
from nodes.data.images import FileImages
from tests.interpreter import write_commands

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
RUN = SHELL | {"python"}
SHOWN = {"text"}
ACTIONS = {"skip", "append", "continue", "file", "needs", "ray-head"}
TIMEOUT_S = 300  # one block; the longest (a Ray head's first run) takes well under a minute
PORT = ":5555"

FENCE = re.compile(r"^(?P<indent> *)```(?P<tag>[^`\s]*)\s*$")
MARKER = re.compile(r"^<!-- snippet: (?P<body>.*) -->$")


@dataclass
class Marker:
    action: str
    args: str
    reason: str


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    tag: str
    code: str
    markers: dict[str, Marker] = field(default_factory=dict)  # by action: one of each at most

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def has(self, action: str) -> bool:
        return action in self.markers

    def args(self, action: str) -> str:
        return self.markers[action].args if action in self.markers else ""

    def reason(self, action: str) -> str:
        return self.markers[action].reason if action in self.markers else ""


def parse_marker(body: str) -> Marker:
    """`ACTION [ARGS] (reason)`: the reason is the balanced parenthesised group that ends the body
    (ARGS may hold parentheses of their own, `'seed=range(2)'`)."""
    body = body.strip()
    if not body.endswith(")"):
        raise ValueError("no (reason) at its end")
    depth = 0
    for i in range(len(body) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(body[i], 0)
        if depth == 0:
            break
    reason, head = body[i + 1 : -1].strip(), body[:i].strip()
    if not reason:
        raise ValueError("an empty (reason)")
    action, _, args = head.partition(" ")
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: expected one of {sorted(ACTIONS)}")
    if action in ("append", "file", "needs") and not args.strip():
        raise ValueError(f"{action} without its argument")
    if action in ("skip", "continue", "ray-head") and args.strip():
        raise ValueError(f"{action} takes no argument, only a (reason)")
    return Marker(action, args.strip(), reason)


def parse(page: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks with their markers, and what is wrong with the page's markup."""
    blocks: list[Block] = []
    errors: list[str] = []
    lines = page.read_text().splitlines()
    pending: list[tuple[int, Marker]] = []
    i = 0
    while i < len(lines):
        where = f"{page.relative_to(ROOT)}:{i + 1}"
        m = MARKER.match(lines[i].strip())
        if m:
            try:
                pending.append((i + 1, parse_marker(m["body"])))
            except ValueError as e:
                errors.append(f"{where}: snippet marker: {e}")
            i += 1
            continue
        if lines[i].strip().startswith("<!-- snippet"):
            errors.append(f"{where}: expected <!-- snippet: ACTION [ARGS] (reason) -->")
        fence = FENCE.match(lines[i])
        if not fence:
            if pending:
                errors.append(f"{where}: a snippet marker not right before a fence")
                pending = []
            i += 1
            continue
        indent, tag, start = len(fence["indent"]), fence["tag"], i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            errors.append(f"{where}: a fence never closed")
        i += 1
        if tag not in RUN | SHOWN:
            errors.append(f"{where}: fence tagged {tag!r}: expected one of {sorted(RUN | SHOWN)}")
        block = Block(page, start + 1, tag, "\n".join(body) + "\n", {mk.action: mk for _, mk in pending})
        if len(block.markers) < len(pending):
            errors.append(f"{where}: the same snippet action twice on one block")
        pending = []
        if tag in SHOWN and block.markers:
            errors.append(f"{where}: a marker on a {tag} block, which never runs")
        runs_tests = re.search(r"\bmake test\b|\bpytest\b", block.code)
        if tag in RUN and runs_tests and "this is the test suite" not in block.reason("skip"):
            errors.append(f"{where}: runs the test suite: mark it <!-- snippet: skip (this is the test suite) -->")
        blocks.append(block)
    return blocks, errors


@dataclass
class Chain:
    """Blocks run one after another in one directory: a block and those that `continue` it."""

    blocks: list[Block]

    @property
    def id(self) -> str:
        return self.blocks[0].where

    def has(self, action: str) -> bool:
        return any(b.has(action) for b in self.blocks)


def collect() -> tuple[list[Chain], list[Block], list[str]]:
    """(chains to run, blocks skipped by `skip`, errors in the pages' markup). A chain that repeats an
    earlier one exactly (the README's example in its page too) runs once."""
    chains: list[Chain] = []
    skipped: list[Block] = []
    errors: list[str] = []
    for page in PAGES:
        blocks, page_errors = parse(page)
        errors += page_errors
        last: Chain | None = None  # the page's chain its next `continue` block joins
        for b in (b for b in blocks if b.tag in RUN):
            if b.has("skip"):
                if len(b.markers) > 1:
                    errors.append(f"{b.where}: skip with other markers")
                skipped.append(b)
            elif b.has("continue"):
                if last is None:
                    errors.append(f"{b.where}: continue, but no block before it on the page runs")
                else:
                    last.blocks.append(b)
            else:
                last = Chain([b])
                chains.append(last)
    seen: set[tuple] = set()
    unique = []
    for chain in chains:
        key = tuple(
            (b.tag, b.code, tuple(sorted((m.action, m.args) for m in b.markers.values()))) for b in chain.blocks
        )
        if key not in seen:
            seen.add(key)
            unique.append(chain)
    chains = unique
    for chain in chains:
        for a, b in zip(chain.blocks, chain.blocks[1:] + [None]):
            if a.has("file") and (b is None or not b.has("continue")):
                errors.append(f"{a.where}: file {a.args('file')}, but no block continues it")
    return chains, skipped, errors


CHAINS, SKIPPED, ERRORS = collect()


def test_the_pages_markup_follows_the_rules():
    assert not ERRORS, "\n".join(ERRORS)
    assert CHAINS, "no snippet found"


def test_the_count_of_snippets_run_appended_and_skipped():
    """What a report on the docs counts (pytest -s shows it): the snippets run, those with arguments
    appended and those skipped, each with its reason; nothing is skipped without one."""
    run = [b for c in CHAINS for b in c.blocks]
    appended = [b for b in run if b.has("append")]
    needing = [b for b in run if b.has("needs")]
    print(f"\n{len(run)} snippets in {len(CHAINS)} tests; {len(appended)} with arguments appended,")
    print(f"{len(needing)} skipped where an extra is missing, {len(SKIPPED)} always skipped:")
    for b in appended:
        print(f"  append {b.args('append')} -- {b.where}: {b.reason('append')}")
    for b in needing:
        print(f"  needs {b.args('needs')} -- {b.where}: {b.reason('needs')}")
    for b in SKIPPED:
        print(f"  skip -- {b.where}: {b.reason('skip')}")
    assert all(b.reason("skip") for b in SKIPPED)


# --- README.md's links (mkdocs sees only docs/) --------------------------------------------------


def slug(heading: str) -> str:
    """Python-Markdown's toc slug, which mkdocs gives each heading: what a `#anchor` names."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # no headings inside code
    return {slug(m) for m in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}


def test_the_readme_links_resolve():
    readme = ROOT / "README.md"
    text = re.sub(r"^```.*?^```", "", readme.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links), "the README links into docs/"
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # a URL: not checked offline
        path, _, anchor = link.partition("#")
        target = (readme.parent / path) if path else readme
        assert target.exists(), f"README.md links to {link}: no such file"
        if anchor:
            assert target.suffix == ".md" and anchor in anchors(target), f"README.md links to {link}: no such heading"


# --- the snippets' `python` ------------------------------------------------------------------------


def harness_path(bin_dir: Path) -> dict[str, str]:
    """This environment with `bin_dir` (where write_commands put `python`) first on PATH."""
    return {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}


def test_the_snippets_python_imports_the_projects_dependencies(tmp_path: Path):
    write_commands(tmp_path)
    code = "import sys, msgpack, omegaconf, zmq; print(sys.executable)"  # torch's import would take seconds
    for name in ("python", "python3"):
        r = subprocess.run([name, "-c", code], env=harness_path(tmp_path), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        assert Path(r.stdout.strip()) == Path(sys.executable)


def test_the_snippets_python_is_the_venvs_own_in_a_venv(tmp_path: Path):
    """Inside a fresh virtualenv (whatever runs the tests), the harness's `python` sees the venv's
    packages: a symlink to its interpreter in another folder would start the base one without them."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    only_here = tmp_path / "only_in_the_venv"
    only_here.mkdir()
    (only_here / "venv_probe.py").write_text("")
    # the venv's packages: a probe module, and this checkout (for tests.interpreter)
    (Path(purelib) / "probe.pth").write_text(f"{only_here}\n{ROOT}\n")
    check = (
        "import subprocess, sys; from pathlib import Path; from tests.interpreter import write_commands; "
        "bin_dir = Path(sys.argv[1]); write_commands(bin_dir); "
        "env = {'PATH': str(bin_dir) + ':/usr/bin:/bin'}; "
        "r = subprocess.run(['python', '-c', 'import venv_probe, sys; print(sys.prefix)'], env=env, "
        "capture_output=True, text=True); print(r.returncode, r.stdout.strip(), r.stderr.strip()[-300:])"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = subprocess.run([python, "-c", check, str(bin_dir)], capture_output=True, text=True, check=True).stdout
    rc, _, rest = out.strip().partition(" ")
    assert rc == "0", rest
    assert Path(rest.split()[0]) == venv


# --- running the chains ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def strip_comment(line: str) -> tuple[str, str]:
    """(command, comment): the comment starts at an unquoted ` #`."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def append_args(code: str, args: str) -> str:
    """`args` after every `python -m` command of a shell block (continuation lines joined first)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        command, comment = strip_comment(line)
        if re.match(r"\s*python3? -m ", command):
            command = f"{command} {args}"
        out.append(f"{command}  {comment}".rstrip())
    return "\n".join(out) + "\n"


def missing(b: Block) -> str:
    """The first name of a `needs NAME...` marker that is missing here (a dataset not installed, a
    module not importable), else ''."""

    built_in = [DATASETS.get(name) for name in DATASETS.names()]
    installed = {n: d.installed() for n, d in zip(DATASETS.names(), built_in) if issubclass(d, FileImages)}

    def absent(name: str) -> bool:
        return installed[name] is None if name in installed else importlib.util.find_spec(name) is None

    return next((name for name in b.args("needs").split() if absent(name)), "")


@pytest.fixture(scope="module")
def ray_head():
    """The address of a Ray head node of this machine (2 CPUs, its own temporary directory), as
    tests/e2e/test_ray_launcher.py starts one; shut down after the module."""
    pytest.importorskip("ray", reason="the Ray snippets need the [ray] extra")
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix sockets live below it
    Path("/tmp/ray").mkdir(exist_ok=True)  # whatever temp_dir, Cluster records its address in /tmp/ray
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, "temp_dir": temp}
    )
    try:
        yield cluster.address
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def params():
    for chain in CHAINS:
        marks = [pytest.mark.xdist_group("ray")] if chain.has("ray-head") else []
        yield pytest.param(chain, id=chain.id, marks=marks)


@pytest.mark.parametrize("chain", list(params()))
def test_the_snippet_runs(chain: Chain, tmp_path: Path, request: pytest.FixtureRequest):
    runnable = [b for b in chain.blocks if not missing(b)]
    if not runnable:
        b = chain.blocks[0]
        pytest.skip(f"{b.where} needs {missing(b)}: {b.reason('needs')}")
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    write_commands(bin_dir)  # the snippets' `python` is this interpreter, in its installation
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    if chain.has("ray-head"):
        env["RAY_ADDRESS"] = request.getfixturevalue("ray_head")
    port = str(free_port())
    for b in runnable:  # a block skipped for an extra is a leaf: no later block reads what it would write
        code = b.code.replace(PORT, f":{port}")
        if b.has("file"):
            (work / b.args("file")).write_text(code)
            continue
        if b.has("append"):
            code = append_args(code, b.args("append"))
        if b.tag == "python":
            argv = [sys.executable, "-c", code]
        else:
            script = tmp_path / f"line{b.line}.sh"
            script.write_text("set -euo pipefail\n" + code)
            argv = ["bash", str(script)]
        r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert r.returncode == 0, (
            f"{b.where} exited {r.returncode}\n--- code\n{code}--- stdout\n{r.stdout[-3000:]}\n"
            f"--- stderr\n{r.stderr[-3000:]}"
        )
