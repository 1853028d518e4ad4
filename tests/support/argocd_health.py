"""Run an Argo CD resource health check (Lua) the way Argo CD does: Lua 5.1 (Argo CD embeds
gopher-lua, a Lua 5.1), the object as the global `obj`, the script's returned table as the
health. Argo CD opens only the package, base and table libraries and a reduced `os` for these
scripts (argo-cd util/lua), so the string, math, io, debug and coroutine libraries and the
string methods are removed here too: a script that relies on them fails here as it would there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lupa.lua51 import LuaRuntime

from tests.support.paths import ROOT

HEALTH = ROOT / "examples" / "gitops" / "argocd" / "health"
NOT_OPENED = ("string", "math", "io", "debug", "coroutine", "os")


def _lua_value(lua: LuaRuntime, value: Any) -> Any:
    """JSON as Argo CD hands it over: objects and arrays become tables (arrays from 1), null nil."""
    if isinstance(value, dict):
        return lua.table_from({k: _lua_value(lua, v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return lua.table_from([_lua_value(lua, v) for v in value])
    return value


def _python_value(value: Any) -> Any:
    if hasattr(value, "items"):
        return {k: _python_value(v) for k, v in value.items()}
    return value


def health(script: str | Path, obj: dict) -> dict:
    """{'status': ..., 'message': ...} as Argo CD would show it for `obj`."""
    text = script.read_text() if isinstance(script, Path) else script
    lua = LuaRuntime(register_eval=False, register_builtins=False)
    lua.execute("debug.setmetatable('', nil)")
    env = lua.globals()
    for name in NOT_OPENED:
        env[name] = None
    env["obj"] = _lua_value(lua, obj)
    result = lua.execute(text)
    assert hasattr(result, "items"), f"the health script returned {result!r}, not a table"
    return _python_value(result)
