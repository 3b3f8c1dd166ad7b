"""YAML refusals name what is wrong: the over-long key, the anchor whose aliases blow up (issue 48)."""

import pytest

from emulator.config import ConfigError, load
from emulator.formats.untrusted_yaml import MAX_KEY, shape_problem

LONG = "k" * 2000
SHOWN = repr(LONG)[:79] + "…"  # cut to 80 characters, as every echoed key


@pytest.mark.parametrize(
    "text, line",
    [
        (f"{LONG}: 1\n", 1),
        (f"dp:\n  {LONG}: 1\n", 2),
        (f'"{LONG}": 1\n', 1),
        (f"a: {{b: 1, {LONG}: 2}}\n", 1),
        (f"- {LONG}: 1\n", 1),
        (f"a: 1\n{LONG}:\n  b: 2\n", 2),
    ],
    ids=["plain", "nested", "quoted", "flow", "in a list", "no value on its line"],
)
def test_a_key_longer_than_yaml_allows_is_named_cut(text, line):
    assert shape_problem(text) == (
        f"has a key {SHOWN} of 2000 characters, longer than YAML's {MAX_KEY} for a key (line {line})"
    )


def test_a_long_key_in_a_scenario_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(f"dp:\n  {'q' * 5000}: 1\n")
    with pytest.raises(ConfigError) as e:
        load(str(path), [])
    assert str(e.value) == (
        f"scenario={path}: the YAML has a key {repr('q' * 5000)[:79]}… of 5000 characters, longer than "
        f"YAML's 1024 for a key (line 2)"
    )


def test_a_key_within_the_limit_and_other_malformed_yaml_are_as_before():
    assert shape_problem(f"{'k' * MAX_KEY}: 1\n") == ""
    with pytest.raises(Exception, match="mapping values are not allowed"):
        shape_problem("a: b: c\n")


def billion_laughs(anchor="lol") -> str:
    lines = [f"a: &{anchor}0 [{', '.join(['1'] * 9)}]"]
    lines += [f"l{i}: &{anchor}{i} [{', '.join([f'*{anchor}{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_named_by_its_anchor():
    # &lol3 is 7381 values: the third of its aliases, in &lol4's list on line 5, passes the limit
    assert shape_problem(billion_laughs()) == "expands to more than 20000 values through aliases of &lol3 (line 5)"


def test_a_long_anchor_is_cut_and_a_document_without_aliases_is_not_blamed_on_them():
    anchor = "x" * 200
    assert shape_problem(billion_laughs(anchor)) == (
        f"expands to more than 20000 values through aliases of &{anchor[:79]}… (line 5)"
    )
    assert shape_problem(f"a: [{', '.join(['1'] * 20_001)}]\n") == "holds more than 20000 values (line 1)"


def test_an_alias_bomb_in_an_override_names_its_anchor():
    levels = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcd", "bcde", strict=True)
    ]
    with pytest.raises(
        ConfigError, match=r"^seed: the YAML value expands to more than 20000 values through aliases of &"
    ):
        load(None, [f"seed=[{', '.join(levels)}]"])
