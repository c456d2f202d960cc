"""ANSI SGR escapes to HTML, statefully: each escape changes the current style, as a terminal does.

Bold, italic and underline; foreground and background in the 16 basic colours,
the 256-colour palette (``38;5;n``/``48;5;n``) and truecolor (``38;2;r;g;b``).
``1m`` then ``31m`` is bold red; ``22``/``23``/``24``/``39``/``49`` undo one
attribute each; ``0`` resets.  Other escapes are dropped; text is escaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from markupsafe import Markup, escape

from dagrunner.report.logtail import strip_ansi

_SGR = re.compile(r"\x1b\[([0-9;:]*)m")
# The report's dark theme: black, red, green, yellow, blue, magenta, cyan, white.
BASIC = ("#8b949e", "#ff7b72", "#7ee787", "#e3b341", "#79c0ff", "#d2a8ff", "#76e3ea", "#e6edf3")
BRIGHT = ("#b1bac4", "#ffa198", "#aff5b4", "#f8e3a1", "#a5d6ff", "#e2c5ff", "#b3f0ff", "#ffffff")
_CUBE = (0, 95, 135, 175, 215, 255)


@dataclass(frozen=True)
class Style:
    bold: bool = False
    italic: bool = False
    underline: bool = False
    fg: str = ""
    bg: str = ""

    def css(self) -> str:
        parts = [
            "font-weight:700" if self.bold else "",
            "font-style:italic" if self.italic else "",
            "text-decoration:underline" if self.underline else "",
            f"color:{self.fg}" if self.fg else "",
            f"background:{self.bg}" if self.bg else "",
        ]
        return ";".join(p for p in parts if p)


def palette(index: int) -> str:
    """The colour of entry ``index`` of the 256-colour palette."""
    if index < 8:
        return BASIC[index]
    if index < 16:
        return BRIGHT[index - 8]
    if index < 232:
        n = index - 16
        r, g, b = _CUBE[n // 36], _CUBE[n // 6 % 6], _CUBE[n % 6]
        return f"#{r:02x}{g:02x}{b:02x}"
    level = 8 + 10 * (min(index, 255) - 232)
    return f"#{level:02x}{level:02x}{level:02x}"


def apply(style: Style, params: str) -> Style:
    """The style after one SGR escape's parameters (``"1;38;5;32"``)."""
    codes = [int(c) if c.isdigit() else 0 for c in re.split(r"[;:]", params)] if params else [0]
    i = 0
    while i < len(codes):
        code = codes[i]
        if code in (38, 48) and i + 1 < len(codes):
            color, used = _extended(codes[i + 1 :])
            i += 1 + used
            if color:
                style = replace(style, fg=color) if code == 38 else replace(style, bg=color)
            continue
        style = _simple(style, code)
        i += 1
    return style


def _extended(rest: list[int]) -> tuple[str, int]:
    """A ``5;n`` or ``2;r;g;b`` colour after 38/48, and how many codes it used."""
    if rest[0] == 5 and len(rest) >= 2:
        return palette(rest[1]), 2
    if rest[0] == 2 and len(rest) >= 4:
        r, g, b = (min(max(v, 0), 255) for v in rest[1:4])
        return f"#{r:02x}{g:02x}{b:02x}", 4
    return "", 1


def _simple(style: Style, code: int) -> Style:
    if code == 0:
        return Style()
    changes: dict[str, object] = {}
    if code == 1:
        changes["bold"] = True
    elif code == 22:
        changes["bold"] = False
    elif code == 3:
        changes["italic"] = True
    elif code == 23:
        changes["italic"] = False
    elif code == 4:
        changes["underline"] = True
    elif code == 24:
        changes["underline"] = False
    elif 30 <= code <= 37:
        changes["fg"] = BASIC[code - 30]
    elif 90 <= code <= 97:
        changes["fg"] = BRIGHT[code - 90]
    elif code == 39:
        changes["fg"] = ""
    elif 40 <= code <= 47:
        changes["bg"] = BASIC[code - 40]
    elif 100 <= code <= 107:
        changes["bg"] = BRIGHT[code - 100]
    elif code == 49:
        changes["bg"] = ""
    return replace(style, **changes) if changes else style  # type: ignore[arg-type]


def ansi_to_html(text: str) -> Markup:
    """Escape ``text`` and render its SGR styles as spans; other escapes are dropped."""
    out: list[str] = []
    style = Style()
    after: dict[tuple[Style, str], Style] = {}  # a log repeats a few escapes many times
    opening: dict[Style, str] = {}
    pos = 0

    def emit(chunk: str) -> None:
        clean = str(escape(strip_ansi(chunk)))  # every other escape and control byte goes
        if not clean:
            return
        if style not in opening:
            css = style.css()
            opening[style] = f'<span style="{css}">' if css else ""
        start = opening[style]
        out.append(f"{start}{clean}</span>" if start else clean)

    for match in _SGR.finditer(text):
        emit(text[pos : match.start()])
        key = (style, match.group(1))
        if key not in after:
            after[key] = apply(style, match.group(1))
        style = after[key]
        pos = match.end()
    emit(text[pos:])
    return Markup("".join(out))
