"""The command line every benchmark shares: its docstring's first paragraph as the
description, --quick (a smoke run, small sizes and few repetitions, which CI makes of every
benchmark so none rots), --strict for those with targets, and the sizes that default to
one value for a full run and another for --quick unless given, declared as a table:

    parser = options.Options(__doc__, "10,000 todos, 1 run", sizes='''
        --runs   3        1       rounds over both schemas
        --table  200,000  10,000  finished todos in the table
        --delay  2.0      0.5     seconds between rounds
    ''')

Each row is the flag, its full and its --quick value (a float when written with a point),
and its help."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def number(text: str) -> float:
    return float(text) if "." in text else int(text.replace(",", ""))


class Options(argparse.ArgumentParser):
    def __init__(self, doc: str, quick: str, sizes: str = "", *, targets: bool = False) -> None:
        """`quick` says what --quick runs; `sizes` is the table above; `targets` adds --strict."""
        super().__init__(description=doc.split("\n\n")[0])
        self.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")
        if targets:
            self.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
        self.sizes: dict[str, tuple[float, float]] = {}
        for row in sizes.strip().splitlines():
            flag, full, quick_value, help = row.split(maxsplit=3)
            action = self.add_argument(
                flag, type=type(number(full)), help=f"{help} ({full}; --quick {quick_value})"
            )
            self.sizes[action.dest] = (number(full), number(quick_value))

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        for dest, (full, quick) in self.sizes.items():
            if getattr(parsed, dest) is None:
                setattr(parsed, dest, quick if parsed.quick else full)
        return parsed
