"""The plug-in registry: decorators, errors that list the known names, built-ins loaded on first use."""

from __future__ import annotations

import sys

import pytest

from jaxrl_mt.registry import Registry


def test_register_get_and_names():
    reg: Registry = Registry("widget")

    @reg.register("b")
    def build_b():
        return "b"

    reg.add("a", len)
    assert reg.get("b") is build_b and reg.get("a") is len
    assert reg.names() == ("a", "b") and list(reg) == ["a", "b"] and len(reg) == 2
    assert "a" in reg and "c" not in reg


def test_unknown_name_lists_known():
    reg: Registry = Registry("widget")
    reg.add("alpha", 1)
    reg.add("beta", 2)
    with pytest.raises(KeyError, match=r"unknown widget 'gamma'; known: alpha, beta"):
        reg.get("gamma")


def test_duplicate_refused_unless_replace():
    reg: Registry = Registry("widget")
    reg.add("a", 1)
    reg.add("a", 1)  # the same object again (a module imported twice) is fine
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", 2)
    reg.add("a", 2, replace=True)
    assert reg.get("a") == 2
    with pytest.raises(ValueError, match="non-empty"):
        reg.add("", 3)


def test_builtins_imported_on_first_lookup_only(tmp_path, monkeypatch):
    mod = tmp_path / "regtest_builtin_mod.py"
    mod.write_text("import tests_registry_holder as h\nh.REG.add('builtin', 42)\nh.IMPORTS.append(1)\n")
    holder = tmp_path / "tests_registry_holder.py"
    holder.write_text("from jaxrl_mt.registry import Registry\n"
                      "REG = Registry('thing', builtins=('regtest_builtin_mod',))\nIMPORTS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tests_registry_holder as h
    try:
        assert h.IMPORTS == []  # making the registry imports nothing
        assert h.REG.get("builtin") == 42
        assert h.REG.names() == ("builtin",) and h.IMPORTS == [1]  # imported once
    finally:
        sys.modules.pop("tests_registry_holder", None)
        sys.modules.pop("regtest_builtin_mod", None)
