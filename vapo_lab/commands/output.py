"""Everything a command shows: the two consoles, one-line errors, tables, values as typed.

Only the command layer prints or exits. Library code raises ``VapoLabError`` subclasses; a
command prints their message (one line per problem) and exits 1, or shows the traceback with
``--debug``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vapo_lab.errors import VapoLabError

F = TypeVar("F", bound=Callable[..., Any])


class WholeLineConsole(Console):
    """A rich console that never wraps or crops a line it prints into a pipe or a log file.

    Rich wraps at the terminal's width, and at 80 columns where there is no terminal, so a path or
    run id in a Slurm log or a ``| grep`` would break across two lines. When the console's file is
    not a terminal (checked at each print: the file can change, e.g. under a test runner), every
    print is a soft-wrap print; on a terminal it wraps as rich does.
    """

    @property  # type: ignore[override]
    def soft_wrap(self) -> bool:
        return self._soft_wrap or not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        self._soft_wrap = value


state = {"debug": False}
stdout = WholeLineConsole()
stderr = WholeLineConsole(stderr=True)

OverridesArg = Annotated[
    Optional[list[str]],
    typer.Argument(
        help="Hydra overrides, e.g. loss.eps_low=0.1 scale=paper clip_higher=off.",
        show_default=False,
    ),
]
PresetOpt = Annotated[
    Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")
]
DropOpt = Annotated[
    Optional[list[str]],
    typer.Option(help="Turn off a component of the preset (repeatable), e.g. --drop clip_higher."),
]
GridArg = Annotated[
    Optional[str], typer.Argument(help="Grid id (or a prefix); default: the latest grid.")
]
GridsDirOpt = Annotated[str, typer.Option(help="Where grids live (the runs' output_dir).")]


def cli_errors(fn: F) -> F:
    """Wraps a command so a VapoLabError prints as one line per problem and exits 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VapoLabError as e:
            if state["debug"]:
                raise
            for line in str(e).splitlines() or [type(e).__name__]:
                stderr.print(
                    f"[bold red]error:[/] {escape(line)}",
                    highlight=False,
                    markup=True,
                    soft_wrap=True,
                )
            raise typer.Exit(1) from None
        except (OSError, MemoryError) as e:  # not ours, and still one line: what failed, what next
            if state["debug"]:
                raise
            stderr.print(
                f"[bold red]error:[/] {escape(system_error_line(e))}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def system_error_line(e: BaseException) -> str:
    """Returns the one line an OSError or MemoryError prints as: what failed, where, what next."""
    if isinstance(e, MemoryError):
        return (
            "out of memory (MemoryError): give the process more memory or choose a smaller "
            "setting (`vapo-lab plan` shows a run's needs); what was saved so far is kept; "
            "--debug shows the traceback"
        )
    what = getattr(e, "strerror", None) or str(e) or type(e).__name__
    where = f": {e.filename}" if getattr(e, "filename", None) else ""
    return (
        f"{what}{where} ({type(e).__name__}): fix that file or folder (permissions, space, path) "
        "and run the same command again; what was saved so far is kept; --debug shows the "
        "traceback"
    )


@dataclass(frozen=True)
class Col:
    """A column of :func:`print_table`; ``typed``: its cells hold names, keys, ids or paths a user
    types, never cut and never broken inside a word."""

    header: str
    typed: bool = False
    justify: str = "left"
    style: str = ""


def print_table(
    title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[str]], lines: bool = False
) -> None:
    """Prints a title line and a table that keeps every typed cell whole.

    On a terminal: a rich table whose typed columns (and those of one word a cell) are as wide as
    their longest line, or else their longest word (a cell then wraps between words). Where even
    that does not fit, and whenever stdout is not a terminal (a pipe, a file): plain tab-separated
    lines, the header first, a cell's lines joined by '; ', for grep and cut.
    """
    if title:
        stdout.print(title, markup=False, highlight=False, soft_wrap=True)
    if stdout.is_terminal:
        cells = [[c.header for c in cols], *rows]

        def longest(i: int, split: Callable[[str], list[str]]) -> int:
            return max(cell_len(w) for r in cells for w in split(r[i]) or [""])

        words = [longest(i, str.split) for i in range(len(cols))]
        # fixed width: typed columns, and those of one word a cell (numbers): never squeezed by rich
        fixed = [
            col.typed or all(len(r[i].split()) <= 1 for r in rows) for i, col in enumerate(cols)
        ]
        for split in (str.splitlines, str.split):  # fixed columns: whole lines, else whole words
            widths = [longest(i, split) if f else None for i, f in enumerate(fixed)]
            # narrowest table: each column its width or longest word, 1 space each side, borders
            if sum((w or m) + 3 for w, m in zip(widths, words)) + 1 > stdout.width:
                continue
            table = Table(show_lines=lines)
            for col, width in zip(cols, widths):
                table.add_column(
                    col.header,
                    justify=col.justify,  # type: ignore[arg-type]
                    style=col.style,
                    overflow="fold",
                    width=width,
                )
            for r in rows:
                table.add_row(*(Text(cell) for cell in r))
            stdout.print(table)
            return
    plain = lambda cell: cell.replace("\t", " ").replace("\n", "; ")  # noqa: E731
    for r in [[c.header for c in cols], *rows]:
        stdout.file.write("\t".join(plain(cell) for cell in r) + "\n")
    stdout.file.flush()


def show(value: Any) -> str:
    """Returns a config value as the user would type it (interpolations shown as '= key')."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return f"= {value[2:-1]}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def peak_rss_mib() -> float:
    """Returns this process's peak resident memory in MiB (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
