"""The typer commands, generated from the operations' declarations (``memoryctl.declaration.table``).

Each command is a function whose signature typer reads: one ``Annotated`` parameter per declared
parameter and output option, spelled as the declaration says (option or argument, short name, a
tri-state ``--useful/--not-useful``). Typer parses and converts; it checks no range or choice
(``Operation.validate`` does, once, wherever the operation runs). The command hands the values to
``Ctx.execute``, which runs the operation through the service or in-process and prints the reply.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import GenericAlias
from typing import Annotated, Any

import typer

from memoryctl.declaration.declare import Operation, Param

_PY = {"string": str, "integer": int, "number": float, "boolean": bool}


def _annotation(p: Param) -> Any:
    """The parameter's Python type and typer's ``Option``/``Argument`` for it."""
    many = p.type == "array" or p.pairs
    kind: Any = GenericAlias(list, (_PY[p.items or "string"],)) if many else _PY[p.type]
    optional = p.default is None and not (p.required and p.option is None)
    if optional:
        kind = kind | None
    if p.option is None:
        info = typer.Argument(help=p.help, metavar=p.metavar, show_default=False)
    else:
        decls = [f"{p.option}/{p.off_flag}" if p.off_flag else p.option]
        if p.short:
            decls.append(p.short)
        info = typer.Option(*decls, help=p.help, metavar=p.metavar)
    return Annotated[kind, info]


def _default(p: Param) -> Any:
    if p.required and p.option is None:
        return inspect.Parameter.empty
    return p.default


def command(op: Operation) -> Callable[..., None]:
    """A typer command for ``op``."""
    from memoryctl.cli.context import Ctx

    def run(ctx: typer.Context, **values: Any) -> None:
        obj = ctx.find_root().obj
        assert isinstance(obj, Ctx)
        raise typer.Exit(obj.execute(op, values))

    shown = [p for p in (*op.params, *op.outputs) if p.cli]
    parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for p in sorted(shown, key=lambda p: p.option is not None):  # arguments first, as python wants
        annotation = _annotation(p)
        parameters.append(
            inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=_default(p))
        )
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {q.name: q.annotation for q in parameters}
    run.__doc__ = op.summary + _exits(op)
    run.__name__ = op.tool
    return run


def _exits(op: Operation) -> str:
    return "\n\nExit codes: " + "; ".join(f"{code} {what}" for code, what in op.exits) + "."
