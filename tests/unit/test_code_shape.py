"""The code's shape under emulator/ and nodes/: short functions, and comments that say why, not how much.

A comment or docstring gives the reason and points at the benchmark that measures it (`python -m bench
...`), never the measured figure: a figure goes stale as the code or the machine changes, and lives in
bench/README.md beside the command that measures it. Comments and every string statement (module,
class, function and attribute docstrings) are read from the source (tokenize, AST).
"""

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("emulator", "nodes")
FILES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
MAX_FUNCTION_LINES = 80
MAX_EXECUTE_LINES = 50  # emulator/run/lifecycle.py::_execute: the run's outline, its steps in functions of their own

# A number (1,000 and 0.25 included), or a range of them (0.15-0.25), not part of a name (SHA-256s, fp16s).
_NUM = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
_RANGE = rf"(?<![\w.,-]){_NUM}(?:\s?[-–]\s?{_NUM})?"
FIGURE = re.compile(
    rf"""
      {_RANGE}\s?(?:ms|µs|us|ns|s|secs?|seconds?|milliseconds?|microseconds?|min|minutes?|h|hours?)\b  # a time
    | {_RANGE}[x×](?![\w×])(?!\s?\d)                             # a ratio: 0.72x, 2x faster (not 32x32 or 3x 3)
    | {_RANGE}\s+times\s+(?:faster|slower|as\b)                  # 3 times faster, 2 times as long
    | {_RANGE}\s?%                                               # a share: 7 % of a run, 40-60%
    | {_RANGE}\s?(?:[KMGT]i?B|kB)(?!\w)                          # a memory size: ~340 MB, 24 GB
    | {_RANGE}\s*(?:minor\s+|major\s+)?page[-\s]faults?          # ~1,700 page faults
    | ~{_NUM}                                                    # an estimate: ~2 s, ~10^5
    """,
    re.VERBOSE,
)

# (file, matched text) -> why it is no measurement. An entry that no longer matches fails the test too.
ALLOWED = {
    (
        "nodes/training/malloc.py",
        "128 KB",
    ): "glibc's default M_MMAP_THRESHOLD (mallopt(3)), the behaviour the module changes",
    ("nodes/training/malloc.py", "32 MB"): "glibc's ceiling of its dynamic mmap threshold, the code's MMAP_THRESHOLD",
    ("emulator/timemodel/traces.py", "0 ms"): "a Mahimahi trace's timestamp 0, part of the trace format",
}


def texts(path: Path) -> Iterator[tuple[int, str]]:
    """(first line, text) of every comment and of every string statement (docstrings) in `path`."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value  # a figure may run across its lines: "3.2\n s"


def functions(path: Path) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def length(f: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    assert f.end_lineno is not None
    return f.end_lineno - f.lineno + 1  # from `def` (decorators excluded) to its last line


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_walk_sees_both_packages_comments_and_docstrings():
    assert {rel(p).split("/")[0] for p in FILES} == set(PACKAGES)
    found = list(texts(ROOT / "emulator" / "run" / "lifecycle.py"))
    assert found[0][1].startswith("#")  # comments first
    assert any(line == 1 and "\n" in t for line, t in found)  # the module's docstring, whole


def test_no_function_is_longer_than_80_lines():
    long = [
        f"{rel(p)}:{f.lineno} {f.name}: {length(f)} lines"
        for p in FILES
        for f in functions(p)
        if length(f) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_execute_is_the_runs_outline():
    module = ast.parse((ROOT / "emulator" / "run" / "lifecycle.py").read_text())
    (execute,) = [f for f in module.body if isinstance(f, ast.FunctionDef) and f.name == "_execute"]
    assert length(execute) <= MAX_EXECUTE_LINES, f"emulator/run/lifecycle.py::_execute is {length(execute)} lines"


@pytest.mark.parametrize(
    "text",
    [
        "0.6 s of the server's CPU",
        "took 0.15-0.25 s, 7 % of a short run",
        "holds ~340 MB before any data",
        "past 24 GB at 750,000",
        "10-1,000 ms an answer",
        "RDP's ~0.1 ms",
        "~5 µs on a 1 MB trace",
        "the whole call takes 0.71-0.86x as long",
        "bmm (2x faster than unfold2d)",
        "1.2× a plain step",
        "3 times faster",
        "~1,700 page faults, 40-60 % of its time",
        "overflows the C stack at ~10^5",
        "1 h 44 min",
    ],
)
def test_a_figure_is_found(text):
    assert FIGURE.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "run.json's SHA-256s",
        "64-channel layers at 32x32 and 16x16",
        "positions x kh*kw*cin",
        "a 3 x 3 kernel",
        "ALI-DPFL eq. 9, Thm 2, Table V",
        "Silence is measured from when the server listens",
        "up to 1500 bytes of the queue leave",
        "26,010 parameters",
        "b_k ~ N(u_k, 1)",
        "every 5 rounds",
    ],
)
def test_no_figure_is_found(text):
    assert not FIGURE.search(text), text


def test_no_measured_figures_in_comments_or_docstrings():
    found, allowed_seen = [], set()
    for p in FILES:
        for line, text in texts(p):
            for m in FIGURE.finditer(text):
                key = (rel(p), m.group())
                if key in ALLOWED:
                    allowed_seen.add(key)
                else:
                    at = line + text.count("\n", 0, m.start())
                    context = text[max(0, m.start() - 40) : m.end() + 40].replace("\n", " ").strip()
                    found.append(f"{rel(p)}:{at}: {m.group()!r} in {context!r}")
    assert not found, (
        "measured figures in comments or docstrings: say why and name the benchmark (python -m bench ...), "
        "the figure goes into bench/README.md; a constant of the code goes into ALLOWED with its reason:\n"
        + "\n".join(found)
    )
    assert allowed_seen == set(ALLOWED), f"ALLOWED entries that match nothing: {sorted(set(ALLOWED) - allowed_seen)}"
