"""The `kata-sizing` console script (and `python -m kata_sizing`): process settings for a
command that lives a fraction of a second, then `cli.main`.

Tests call `cli.main` in their own process; these settings belong to the console script's
process only, which is why they live here and not in `cli`.
"""

import gc
import sys
import types

# pydantic imports this module when it builds its first model, to look up plugins among the
# entry points of every installed distribution. Importing importlib.metadata (email, zipfile,
# csv...) and reading that metadata is about a twentieth of a `kata-sizing render`;
# PYDANTIC_DISABLE_PLUGINS skips the reading but not the import. kata-sizing runs no pydantic
# plugin, so the console script puts the loader's answer for "no plugins" in its place.
_PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"


def _no_pydantic_plugins() -> None:
    if _PYDANTIC_PLUGIN_LOADER not in sys.modules:
        loader = types.ModuleType(_PYDANTIC_PLUGIN_LOADER, "kata-sizing's console script: no pydantic plugins.")
        loader.get_plugins = lambda: ()
        sys.modules[_PYDANTIC_PLUGIN_LOADER] = loader


def main() -> int:
    # Start-up allocates what lives as long as the process (modules, classes, validators):
    # the cyclic collector's passes over it free nothing and cost about 3% of a render.
    # Inputs are bounded (bounded.MAX_INPUT_BYTES); `kata-sizing operator`, the one
    # long-lived command, turns the collector back on (cli.operator.run).
    gc.disable()
    _no_pydantic_plugins()
    from .cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
