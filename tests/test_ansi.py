"""ANSI SGR escapes render statefully, as a terminal shows them (issue #12, item 14)."""

from __future__ import annotations

from dagrunner.report.ansi import BASIC, ansi_to_html, palette

RED, GREEN, BLUE = BASIC[1], BASIC[2], BASIC[4]


def test_256_colour_is_its_palette_entry_not_a_basic_code() -> None:
    html = str(ansi_to_html("\x1b[38;5;32mtext\x1b[0m"))
    assert html == f'<span style="color:{palette(32)}">text</span>'
    assert palette(32) == "#0087d7" and GREEN not in html


def test_256_colour_background_is_a_background() -> None:
    html = str(ansi_to_html("\x1b[48;5;31mtext"))
    assert html == f'<span style="background:{palette(31)}">text</span>' and RED not in html


def test_bold_survives_a_later_colour_and_each_attribute_undoes_alone() -> None:
    html = str(ansi_to_html("\x1b[1mA\x1b[31mB\x1b[22mC\x1b[39mD"))
    assert html == (
        '<span style="font-weight:700">A</span>'
        f'<span style="font-weight:700;color:{RED}">B</span>'
        f'<span style="color:{RED}">C</span>D'
    )


def test_basic_backgrounds_truecolor_and_escaping() -> None:
    html = str(ansi_to_html("\x1b[44m<b>\x1b[0m \x1b[38;2;1;2;3mx\x1b[m"))
    assert html == (
        f'<span style="background:{BLUE}">&lt;b&gt;</span> <span style="color:#010203">x</span>'
    )
    assert "\x1b" not in str(ansi_to_html("\x1b]0;title\x07plain\x1b[2Kline"))


def test_every_escape_a_terminal_acts_on_is_dropped_from_a_log_view() -> None:
    """DCS, RIS, 8-bit CSI, OSC links and the APC/PM/SOS strings are active when someone
    ``cat``s the report; only SGR colours survive, as styles."""
    log = (
        "a\x1bPqdcs\x1b\\b \x1bc \x9b31mred\x9b0m \x1b_apc\x1b\\ \x1b^pm\x1b\\ \x1bXsos\x1b\\ "
        "\x90dcs\x9c \x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b(B\x1b7 \x1b[31mok\x1b[0m\tend"
    )
    html = str(ansi_to_html(log))
    assert html == 'ab  red     link  <span style="color:#ff7b72">ok</span>\tend'
    assert not any(0x80 <= ord(c) <= 0x9F or (ord(c) < 0x20 and c != "\t") for c in html)
