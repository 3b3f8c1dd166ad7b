"""One registry per kind of plug-in: built-ins by name, a user's class by package.module:ClassName."""

import sys

import pytest

from nodes.contracts.plugins import Registry, is_user_class


class Base:
    pass


def fresh() -> Registry[Base]:
    return Registry("demo.kind", Base, "tests.unit.test_plugins.Base", ValueError)


def test_a_built_in_registers_with_one_line_and_is_found_by_name():
    registry = fresh()

    @registry.register("plain")
    class Plain(Base):
        pass

    assert registry.get("plain") is Plain and registry.names() == ("plain",)
    assert registry.admits("plain") and registry.admits("pkg.mod:Cls") and not registry.admits("other")
    assert registry.describe() == "plain | package.module:ClassName"


def test_a_name_is_registered_once_and_is_never_a_reference():
    registry = fresh()
    registry.register("a")(type("A", (Base,), {}))
    with pytest.raises(ValueError, match=r"demo\.kind: 'a' is registered twice"):
        registry.register("a")(type("B", (Base,), {}))
    with pytest.raises(ValueError, match="not a plain name"):
        registry.register("x:Y")(type("C", (Base,), {}))


def test_a_users_class_is_imported_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(
        "from nodes.contracts.plugins import Registry\nclass Mine(Registry):\n    pass\nclass Other:\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_plugin", raising=False)
    registry: Registry[Registry[object]] = Registry("demo.kind", Registry, "nodes.contracts.plugins.Registry")
    assert registry.get("my_plugin:Mine").__name__ == "Mine" and is_user_class("my_plugin:Mine")
    with pytest.raises(ValueError, match=r"demo.kind = 'my_plugin:Other': my_plugin.Other is not one; expected a sub"):
        registry.get("my_plugin:Other")


def test_an_unknown_name_is_one_error_naming_the_key_and_the_choices():
    registry = fresh()
    registry.register("plain")(type("P", (Base,), {}))
    with pytest.raises(ValueError, match=r"^demo.kind = 'nope': expected plain \| package.module:ClassName$"):
        registry.get("nope")
