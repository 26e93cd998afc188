"""The one error-handling ``main`` of every console script (setup.py's ``console_scripts``: edgefm-vla, -bag,
-router, -demo, -llm, -sim, -cloud, -shm-clean).

    @cli_main("edgefm-bag", subcommands=True)
    def main(argv: list[str] | None = None) -> int: ...

Bad input is the user's error, not the program's: ``ValueError`` and ``FileNotFoundError`` (the configs and
loaders raise them naming the bad value) become one line on stderr, ``<prog> [<subcommand>]: error: <message>``,
and exit code 2 (argparse's own for a bad argument), with no traceback. Ctrl-C (``KeyboardInterrupt``) ends
with ``<prog>: interrupted`` and 130 (128 + SIGINT, as a shell reports it). A command adds the exceptions
that are expected failures for it (``errors``: e.g. the demo's RuntimeError for a graph that did not come up).
Anything else is a bug and keeps its traceback.

It lives in housekeeping (what a process does at its end) so that the libraries' own CLIs (cloud/cli.py,
housekeeping/shm.py) use it too: libraries import nothing from tools/.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, Sequence

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)
EXIT_USAGE = 2  # argparse's exit code for a bad argument
EXIT_INTERRUPTED = 130  # 128 + SIGINT

Main = Callable[..., "int | None"]


def one_line(e: BaseException) -> str:
    """The exception's message on one line (a multi-line message joined with '; ')."""
    text = str(e).strip() or type(e).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def command_name(prog: str, argv: Sequence[str], subcommands: bool) -> str:
    """``prog``, plus the subcommand (the first word of ``argv``) where the CLI has subcommands."""
    if subcommands and argv and not argv[0].startswith("-"):
        return f"{prog} {argv[0]}"
    return prog


def cli_main(prog: str, subcommands: bool = False, errors: tuple[type[BaseException], ...] = ()) -> Callable[[Main], Main]:
    """Decorate a console script's ``main(argv=None) -> int``; see the module's docstring."""
    caught = USER_ERRORS + tuple(errors)

    def wrap(fn: Main) -> Main:
        @functools.wraps(fn)
        def main(argv: Sequence[str] | None = None) -> int:
            args = list(sys.argv[1:] if argv is None else argv)
            try:
                rc = fn(args)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                return EXIT_INTERRUPTED
            except caught as e:
                print(f"{command_name(prog, args, subcommands)}: error: {one_line(e)}", file=sys.stderr, flush=True)
                return EXIT_USAGE
            return 0 if rc is None else int(rc)

        return main

    return wrap
