"""The command line's parser class and argument types (no machinery imported: ``--help``
and ``--version`` stay fast)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import Literal, NoReturn

from dagrunner.errors import DagrunnerError
from dagrunner.manifest.fields import MAX_BATCH
from dagrunner.units import MAX_WINDOW, parse_duration


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are DagrunnerErrors (``bad-usage``, exit 2): the real
    message survives ``--json``, the usage shown is the subcommand's, and a misspelt
    command gets a did-you-mean."""

    def error(self, message: str) -> NoReturn:
        hint = f"{' '.join(self.format_usage().split())}; see {self.prog} --help"
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1)
            if close:
                hint = f"did you mean {close[0]!r}? " + hint
        raise DagrunnerError("bad-usage", message, hint=hint)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # told by the subcommand that was given, with its own usage
            self.chosen(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The deepest subcommand parser that ``parsed`` went through."""
        parser: argparse.ArgumentParser = self
        while parser._subparsers is not None:
            action = next(
                a
                for a in parser._subparsers._group_actions
                if isinstance(a, argparse._SubParsersAction)
            )
            name = getattr(parsed, action.dest or "", None)
            if name not in action.choices:
                break
            parser = action.choices[name]
        return parser


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def count(text: str) -> int:
    if text == "0":
        return 0
    return positive_int(text)


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def batch(text: str) -> int | Literal["auto"]:
    """``auto`` (sized from the queue's outcomes) or 1..MAX_BATCH."""
    if text == "auto":
        return "auto"
    value = positive_int(text)
    if value > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH}")
    return value


def window(text: str) -> int | None:
    """``auto`` (None: adaptive) or 1..MAX_WINDOW."""
    if text == "auto":
        return None
    value = positive_int(text)
    if value > MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"at most {MAX_WINDOW}")
    return value


URGENT = 1 << 30  # integration/queue.URGENT (not imported: --help loads no machinery)


def priority(text: str) -> int:
    """``urgent`` or a whole number from -1000 to 1000."""
    if text == "urgent":
        return URGENT
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor urgent") from None
    if not -1000 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be from -1000 to 1000, or urgent")
    return value
