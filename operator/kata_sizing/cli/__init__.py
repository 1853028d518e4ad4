"""`kata-sizing`: the command-line shell over the pure core, one module per command.

Exit codes: 0 ok, 1 the policy (or the audited install) breaks a rule, 2 the input cannot
be read. Every problem is one line on stderr; no traceback reaches the user.

A command is a module of this package with `HELP` (its line in `kata-sizing --help`),
`add_arguments(parser)` and `run(args) -> int`, named in COMMANDS. Only the command being
run is imported (and builds its flags): a module imports at its top only what its flags
need, the rest inside `run`; kopf and the kubernetes client are imported only by `operator`,
matplotlib only with `--plot`. `tests/unit/test_layers.py` holds both.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from .. import __version__
from ..core import bounded
from ..core.bounded import InputError
from ..core.model import PolicyError
from ..core.quantity import QuantityError
from .common import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, load_policies, print_problems

__all__ = ["COMMANDS", "EXIT_INVALID", "EXIT_OK", "EXIT_UNREADABLE", "build_parser", "command", "load_policies", "main"]

# The commands in the order `kata-sizing --help` lists them: name -> module of this package.
COMMANDS = {
    "render": "render",
    "explain": "explain",
    "validate": "validate",
    "calibrate": "calibrate",
    "survey": "survey",
    "probe": "probe",
    "audit": "audit",
    "operator": "operator",
}


def command(name: str) -> ModuleType:
    """The module of one command, imported now."""
    return importlib.import_module(f".{COMMANDS[name]}", __name__)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with `only` of that command alone (the others are not
    imported: `kata-sizing render` loads nothing of `survey` or `operator`)."""
    parser = argparse.ArgumentParser(
        prog="kata-sizing",
        description="Size Kata Containers runtime classes from a KataSizingPolicy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if only is None else [only]:
        module = command(name)
        module.add_arguments(sub.add_parser(name, help=module.HELP))
        sub.choices[name].set_defaults(func=module.run)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    """The command argv runs, when its first word names one (else the whole parser is needed:
    --help, --version, a typo argparse should name among the choices)."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_command_in(arguments)).parse_args(arguments)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {bounded.printable(str(exc))}", file=sys.stderr)
        return EXIT_UNREADABLE
    except PolicyError as exc:
        print_problems(exc.problems)
        return EXIT_INVALID
    except QuantityError as exc:
        print(f"error: {bounded.printable(str(exc))}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
