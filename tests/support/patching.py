"""Replacing a function for a test where mirrorline looks it up: in its own module and in every mirrorline module
that imported it by name (``from mirrorline.compile.inserts import compile_inserts`` binds the compiler's own name,
which a patch of the defining module alone would miss)."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest


def patch_where_used(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, new: Any) -> list[str]:
    """Set ``name`` to ``new`` in ``module`` and wherever a loaded ``mirrorline`` module holds the same object under
    that name; returns the modules patched (at least ``module``)."""
    real = getattr(module, name)
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is module or (mod_name.startswith("mirrorline") and getattr(mod, name, None) is real):
            monkeypatch.setattr(mod, name, new)
            patched.append(mod_name)
    return patched
