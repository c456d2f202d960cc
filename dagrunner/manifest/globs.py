"""The manifest's glob language, relative to the repository root: what ``inputs`` and
``[integrate] protected`` patterns mean, compiled once each."""

from __future__ import annotations

import re
from functools import lru_cache

_WILDCARD = re.compile(r"[*?\[]")


@lru_cache(maxsize=4096)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob relative to the repository root: ``*`` and ``?`` within a segment, ``**`` across.

    ``**`` crosses ``/`` only as a whole segment (``a/**/b``, ``a/**``); elsewhere (``a**b``)
    it is ``*``.  ``[...]`` is a character class (``[!...]`` negated); ``{a,b}`` is not
    supported.  Raises ValueError for a pattern that is not a valid glob.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        whole = i == 0 or pattern[i - 1] == "/"
        if whole and pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif whole and pattern.startswith("**", i) and i + 2 == len(pattern):
            out.append(".*")
            i += 2
        elif pattern.startswith("**", i):
            out.append("[^/]*")
            i += 2
        elif ch == "*":
            out.append("[^/]*")
            i += 1
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(ch))
                i += 1
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body in ("", "!"):
                    raise ValueError(f"{pattern!r} has an empty character class []")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end + 1
        else:
            out.append(re.escape(ch))
            i += 1
    try:
        return re.compile("".join(out) + r"\Z")
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid glob ({exc})") from None


def literal_prefix(pattern: str) -> str:
    match = _WILDCARD.search(pattern)
    return pattern if match is None else pattern[: match.start()]
