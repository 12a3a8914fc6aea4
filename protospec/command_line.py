"""How every `python -m protospec...` command ends: a bad argument or input is one line on stderr
naming the problem and exit status 2 (argparse's own convention), never a traceback; other failures
keep theirs, since they are bugs to report."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn

from protospec.errors import ProtospecError

BAD_INPUT = 2


class CommandParser(argparse.ArgumentParser):
    """argparse for the commands: a bad argument is one line, `PROG: error: ...`, and status 2 (argparse
    prints its whole usage block first; --help still shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}\n")


def run_command(main: Callable[[], object]) -> NoReturn:
    """Call a command's main() and exit with its status; a ProtospecError (a named bad input or
    setting) or a SystemExit with a message becomes `error: ...` and status 2. A main() that returns
    something other than an int (the bench returns its report, for Python callers) succeeded: status 0,
    since sys.exit(report) would print the report to stderr and exit 1."""
    try:
        status = main()
    except ProtospecError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except SystemExit as e:
        if isinstance(e.code, str):  # raise SystemExit("message"): the commands' own checks
            print(f"error: {e.code}", file=sys.stderr)
            sys.exit(BAD_INPUT)
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
