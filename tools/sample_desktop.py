"""The sample set's simulated desktop (`tools/samplegen.py`): a fixed palette and fonts so PNGs are small
and identical run to run, and the widgets, dialogs and screens a `Painter` draws (`render`)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 640, 400

# ---------------------------------------------------------------------------------------------------
# Drawing: a fixed palette so PNGs are small, few-coloured and identical run to run.

COLORS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "black": (20, 20, 24),
    "text": (40, 44, 52),
    "muted": (110, 116, 128),
    "border": (160, 166, 176),
    "panel": (236, 238, 242),
    "panel2": (222, 226, 232),
    "desktop": (46, 84, 110),
    "title": (52, 96, 168),
    "accent": (40, 110, 220),
    "select": (200, 222, 250),
    "red": (214, 48, 49),
    "blue": (36, 99, 235),
    "green": (34, 160, 84),
    "yellow": (240, 196, 25),
    "orange": (240, 130, 30),
    "purple": (136, 70, 200),
    "dark": (48, 52, 60),
    "darkpanel": (70, 74, 84),
    "grey1": (70, 74, 80),
    "grey2": (140, 144, 150),
    "grey3": (190, 194, 200),
    "grey4": (214, 216, 220),
    "lightblue1": (120, 170, 240),
    "lightblue2": (160, 196, 246),
    "ok": (220, 244, 226),
}
SHAPE_COLORS = ("red", "blue", "green", "yellow", "orange", "purple")


def _palette_image() -> Image.Image:
    pal: list[int] = []
    for rgb in COLORS.values():
        pal.extend(rgb)
    pal.extend([0, 0, 0] * (256 - len(COLORS)))
    img = Image.new("P", (1, 1))
    img.putpalette(pal)
    return img


_PALETTE = _palette_image()


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    # Pillow's bundled font: the same glyphs on every machine, no system font lookup.
    try:
        return ImageFont.load_default(size=size)
    except (ImportError, OSError):  # Pillow without FreeType: the bitmap font is still legible
        return ImageFont.load_default()


FONT = _font(13)
SMALL = _font(11)
BIG = _font(15)

Box = tuple[int, int, int, int]


def png_bytes(img: Image.Image) -> bytes:
    """Quantise an RGB frame to the fixed palette (no dithering) and encode it as a PNG."""
    quant = img.quantize(palette=_PALETTE, dither=Image.Dither.NONE)
    buf = io.BytesIO()
    quant.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------
# The simulated desktop.


@dataclass
class W:
    """One widget. ``kind`` picks the drawing; the other fields are that widget's state."""

    kind: str  # field, dropdown, textarea, list, grid, canvas, slider, text, calendar, button, toggle
    name: str
    label: str = ""
    value: Any = ""
    options: list[Any] = field(default_factory=list)
    open: bool = False
    focused: bool = False
    height: int = 26
    selected: Any = None
    offset: int = 0  # rows scrolled away at the top of a list


@dataclass
class Dialog:
    title: str
    body: list[W]
    buttons: list[W]


@dataclass
class Screen:
    """The whole desktop: one maximised window, maybe a dialog or context menu on top."""

    app: str
    title: str
    menu: list[str]
    toolbar: list[W] = field(default_factory=list)
    sidebar: W | None = None
    body: list[W] = field(default_factory=list)
    dialog: Dialog | None = None
    context: tuple[int, int, list[str]] | None = None
    status: str = "Ready"
    clock: str = "09:41"

    def w(self, name: str) -> W:
        """The widget called ``name`` anywhere on screen (dialog first)."""
        groups: list[list[W]] = []
        if self.dialog:
            groups += [self.dialog.body, self.dialog.buttons]
        groups += [self.body, self.toolbar, [self.sidebar] if self.sidebar else []]
        for group in groups:
            for widget in group:
                if widget.name == name:
                    return widget
        raise KeyError(name)

    def focus(self, name: str | None) -> None:
        """Give keyboard focus to one widget (None: to nothing)."""
        for group in ([self.dialog.body] if self.dialog else []) + [self.body]:
            for widget in group:
                widget.focused = widget.name == name


class Painter:
    """Draws a Screen and remembers where every clickable thing landed (``rects``)."""

    def __init__(self) -> None:
        self.img = Image.new("RGB", (WIDTH, HEIGHT), COLORS["desktop"])
        self.d = ImageDraw.Draw(self.img)
        self.rects: dict[str, Box] = {}

    def text(self, xy: tuple[int, int], s: str, color: str = "text", font: Any = FONT) -> None:
        self.d.text(xy, s, fill=COLORS[color], font=font)

    def box(self, b: Box, fill: str = "white", outline: str | None = "border", width: int = 1) -> None:
        self.d.rectangle(b, fill=COLORS[fill], outline=COLORS[outline] if outline else None, width=width)

    def fit(self, s: str, width: int, font: Any = FONT, keep_start: bool = False) -> str:
        """``s`` cut to ``width`` pixels: keep its end (paths, typed text) or its start (labels)."""
        if self.d.textlength(s, font=font) <= width:
            return s
        if keep_start:
            while s and self.d.textlength(s + "...", font=font) > width:
                s = s[:-1]
            return s + "..."
        while s and self.d.textlength("..." + s, font=font) > width:
            s = s[1:]
        return "..." + s

    # -- frame -------------------------------------------------------------------------------------
    def screen(self, s: Screen) -> None:
        self.box((0, 0, WIDTH - 1, 22), "title", None)
        self.text((8, 4), self.fit(s.title, WIDTH - 90), "white")
        self.d.line((WIDTH - 58, 15, WIDTH - 50, 15), fill=COLORS["white"], width=2)  # minimise
        self.d.rectangle((WIDTH - 38, 7, WIDTH - 30, 15), outline=COLORS["white"], width=1)  # maximise
        self.d.line((WIDTH - 18, 7, WIDTH - 10, 15), fill=COLORS["white"], width=2)  # close
        self.d.line((WIDTH - 18, 15, WIDTH - 10, 7), fill=COLORS["white"], width=2)
        self.box((0, 23, WIDTH - 1, 41), "panel", None)
        x = 8
        for item in s.menu:
            self.text((x, 25), item)
            self.rects[f"menu:{item}"] = (x - 4, 23, x + int(self.d.textlength(item, font=FONT)) + 4, 41)
            x += int(self.d.textlength(item, font=FONT)) + 16
        self.box((0, 42, WIDTH - 1, 70), "panel2", None)
        x = 8
        for b in s.toolbar:
            wdt = int(self.d.textlength(b.label, font=FONT)) + 18
            pressed = bool(b.value)
            self.box(
                (x, 46, x + wdt, 66), "select" if pressed else "white", "accent" if pressed else "border"
            )
            self.text((x + 9, 49), b.label)
            self.rects[b.name] = (x, 46, x + wdt, 66)
            x += wdt + 6
        left = 8
        if s.sidebar is not None:
            self.box((0, 71, 135, 356), "panel", None)
            self.list_rows(s.sidebar, (4, 76, 126, 352), header=False)
            left = 138
        self.box((left - 2, 71, WIDTH - 1, 356), "white", None)
        y = 78
        for widget in s.body:
            y = self.widget(widget, left, y, WIDTH - 10) + 6
        self.box((0, 357, WIDTH - 1, 375), "panel", None)
        self.text((8, 359), self.fit(s.status, WIDTH - 20))
        self.box((0, 376, WIDTH - 1, HEIGHT - 1), "dark", None)
        self.box((6, 380, 110, 396), "darkpanel", None)
        self.text((12, 381), self.fit(s.app, 94), "white")
        self.text((WIDTH - 48, 381), s.clock, "white")
        if s.dialog is not None:
            self.dialog(s.dialog)
        for widget in ([*s.dialog.body] if s.dialog else []) + s.body:
            if widget.kind == "dropdown" and widget.open:
                self.dropdown_list(widget)
        if s.context is not None:
            cx, cy, items = s.context
            self.box((cx, cy, cx + 150, cy + 8 + 20 * len(items)), "white", "grey1")
            for i, item in enumerate(items):
                self.text((cx + 10, cy + 5 + 20 * i), item)
                self.rects[f"ctx:{item}"] = (cx + 2, cy + 3 + 20 * i, cx + 148, cy + 21 + 20 * i)

    def dialog(self, dlg: Dialog) -> None:
        h = 40 + sum(wd.height + 6 for wd in dlg.body) + 36
        x0, y0 = 110, max(60, (HEIGHT - h) // 2 - 10)
        x1, y1 = WIDTH - 110, y0 + h
        self.box((x0 + 4, y0 + 4, x1 + 4, y1 + 4), "grey1", None)
        self.box((x0, y0, x1, y1), "panel", "grey1")
        self.box((x0, y0, x1, y0 + 22), "title", None)
        self.text((x0 + 8, y0 + 4), dlg.title, "white")
        y = y0 + 32
        for wd in dlg.body:
            y = self.widget(wd, x0 + 10, y, x1 - 10) + 6
        bx = x1 - 10
        for b in reversed(dlg.buttons):
            wdt = int(self.d.textlength(b.label, font=FONT)) + 24
            primary = bool(b.value)
            self.box((bx - wdt, y1 - 30, bx, y1 - 8), "accent" if primary else "white", "grey1")
            self.text((bx - wdt + 12, y1 - 27), b.label, "white" if primary else "text")
            self.rects[b.name] = (bx - wdt, y1 - 30, bx, y1 - 8)
            bx -= wdt + 8

    # -- widgets -----------------------------------------------------------------------------------
    def widget(self, wd: W, x0: int, y0: int, x1: int) -> int:
        """Draw ``wd`` from (x0, y0) to the right edge x1; return the bottom y."""
        label_w = 0
        if wd.label and wd.kind in ("field", "dropdown", "slider", "toggle"):
            self.text((x0, y0 + 5), wd.label, "muted")
            label_w = 84
        bx0 = x0 + label_w
        y1 = y0 + wd.height
        if wd.kind == "text":
            self.text((x0, y0 + 4), str(wd.value), font=BIG if wd.label == "big" else FONT)
        elif wd.kind == "field":
            self.box((bx0, y0, x1, y1), "white", "accent" if wd.focused else "border", 2 if wd.focused else 1)
            shown = self.fit(str(wd.value) + ("|" if wd.focused else ""), x1 - bx0 - 12)
            self.text((bx0 + 6, y0 + 6), shown)
            self.rects[wd.name] = (bx0, y0, x1, y1)
        elif wd.kind == "dropdown":
            self.box((bx0, y0, x1, y1), "white", "accent" if wd.open else "border")
            self.text((bx0 + 6, y0 + 6), str(wd.value))
            self.text((x1 - 16, y0 + 5), "v", "muted")
            self.rects[wd.name] = (bx0, y0, x1, y1)
        elif wd.kind == "toggle":
            on = bool(wd.value)
            self.d.rounded_rectangle(
                (bx0, y0 + 3, bx0 + 40, y1 - 3), radius=10, fill=COLORS["accent" if on else "grey3"]
            )
            kx = bx0 + 22 if on else bx0 + 2
            self.d.ellipse((kx, y0 + 5, kx + 16, y1 - 5), fill=COLORS["white"])
            self.text((bx0 + 50, y0 + 5), "On" if on else "Off")
            self.rects[wd.name] = (bx0, y0 + 3, bx0 + 40, y1 - 3)
        elif wd.kind == "slider":
            self.d.line((bx0, y0 + 13, x1 - 50, y0 + 13), fill=COLORS["grey3"], width=4)
            kx = bx0 + int((x1 - 50 - bx0) * int(wd.value) / 100)
            self.d.line((bx0, y0 + 13, kx, y0 + 13), fill=COLORS["accent"], width=4)
            self.d.ellipse((kx - 7, y0 + 6, kx + 7, y0 + 20), fill=COLORS["accent"])
            self.text((x1 - 40, y0 + 5), f"{int(wd.value)}%")
            self.rects[wd.name] = (bx0, y0, x1 - 50, y1)
        elif wd.kind == "textarea":
            self.box((x0, y0, x1, y1), "white", "accent" if wd.focused else "border")
            lines = str(wd.value).split("\n")
            if wd.focused:
                lines[-1] += "|"
            for i, line in enumerate(lines[: (wd.height - 8) // 17]):
                self.text((x0 + 6, y0 + 5 + 17 * i), self.fit(line, x1 - x0 - 12))
            self.rects[wd.name] = (x0, y0, x1, y1)
        elif wd.kind == "list":
            self.list_rows(wd, (x0, y0, x1, y1), header=True)
        elif wd.kind == "grid":
            self.grid(wd, x0, y0)
        elif wd.kind == "canvas":
            self.canvas(wd, (x0, y0, x1, y1))
        elif wd.kind == "calendar":
            self.calendar(wd, (x0, y0, x1, y1))
        return y1

    def dropdown_list(self, wd: W) -> None:
        bx0, _, bx1, by1 = self.rects[wd.name]
        rows = wd.options
        self.box((bx0, by1, bx1, by1 + 4 + 20 * len(rows)), "white", "grey1")
        for i, opt in enumerate(rows):
            r = (bx0 + 1, by1 + 2 + 20 * i, bx1 - 1, by1 + 21 + 20 * i)
            if opt == wd.value:
                self.box(r, "select", None)
            self.text((bx0 + 8, r[1] + 3), str(opt))
            self.rects[f"{wd.name}:{opt}"] = r

    def list_rows(self, wd: W, b: Box, header: bool) -> None:
        x0, y0, x1, y1 = b
        self.rects[wd.name] = b
        rows: list[Sequence[str]] = [r if isinstance(r, (list, tuple)) else (r,) for r in wd.value]
        cols = wd.options or [""]
        colx = [x0 + 6 + int((x1 - x0) * f) for f in ([0.0, 0.45, 0.75][: len(cols)])]
        colw = [b - a - 10 for a, b in zip(colx, [*colx[1:], x1 + 4], strict=True)]
        y = y0
        if header and wd.label:
            self.box((x0, y0, x1, y0 + 20), "panel", None)
            for cx, name in zip(colx, cols, strict=False):
                self.text((cx, y0 + 3), name, "muted", SMALL)
            y += 22
        sel = wd.selected if isinstance(wd.selected, (list, set, tuple)) else [wd.selected]
        for row in rows[wd.offset :]:
            if y + 20 > y1:
                break
            r = (x0, y, x1, y + 20)
            if row[0] in sel:
                self.box(r, "select", None)
            for cx, cw, cell in zip(colx, colw, row, strict=False):
                self.text((cx, y + 3), self.fit(str(cell), cw, keep_start=True))
            self.rects[f"{wd.name}:{row[0]}"] = r
            y += 21

    def grid(self, wd: W, x0: int, y0: int) -> None:
        cells: dict[str, str] = wd.value
        bold: set[str] = wd.options[0] if wd.options else set()
        sel: set[str] = set(wd.selected or ())
        cw, rh, hw = 110, 21, 30
        for c, col in enumerate("ABCD"):
            cx = x0 + hw + c * cw
            self.box((cx, y0, cx + cw, y0 + rh), "panel", "grey3")
            self.text((cx + cw // 2 - 4, y0 + 4), col, "muted")
        for r in range(1, 11):
            ry = y0 + r * rh
            self.box((x0, ry, x0 + hw, ry + rh), "panel", "grey3")
            self.text((x0 + 8, ry + 4), str(r), "muted", SMALL)
            for c, col in enumerate("ABCD"):
                ref = f"{col}{r}"
                cx = x0 + hw + c * cw
                self.box((cx, ry, cx + cw, ry + rh), "select" if ref in sel else "white", "grey3")
                if ref in cells:
                    txt = cells[ref]
                    self.text((cx + 5, ry + 4), self.fit(txt, cw - 10), "black")
                    if ref in bold:  # faux bold: draw again one pixel right
                        self.text((cx + 6, ry + 4), self.fit(txt, cw - 10), "black")
                self.rects[f"{wd.name}:{ref}"] = (cx, ry, cx + cw, ry + rh)
        if wd.focused and sel:
            ref = sorted(sel)[0]
            self.box(self.rects[f"{wd.name}:{ref}"], "select", "accent", 2)
            if ref in cells:
                self.text(
                    (self.rects[f"{wd.name}:{ref}"][0] + 5, self.rects[f"{wd.name}:{ref}"][1] + 4), cells[ref]
                )

    def canvas(self, wd: W, b: Box) -> None:
        self.box(b, "grey4", None)
        x0, y0, x1, y1 = b
        slide = (x0 + 20, y0 + 10, x1 - 20, y1 - 10)
        self.box(slide, "white", "grey2")
        self.rects[wd.name] = slide
        for shape in wd.value:
            sb, color = shape["box"], COLORS[shape["fill"]]
            if shape["kind"] == "Rectangle":
                self.d.rectangle(sb, fill=color, outline=COLORS["black"], width=2)
            elif shape["kind"] == "Ellipse":
                self.d.ellipse(sb, fill=color, outline=COLORS["black"], width=2)
            elif shape["kind"] == "Triangle":
                pts = [((sb[0] + sb[2]) // 2, sb[1]), (sb[2], sb[3]), (sb[0], sb[3])]
                self.d.polygon(pts, fill=color, outline=COLORS["black"], width=2)
            if shape.get("selected"):
                for hx, hy in ((sb[0], sb[1]), (sb[2], sb[1]), (sb[0], sb[3]), (sb[2], sb[3])):
                    self.box((hx - 3, hy - 3, hx + 3, hy + 3), "white", "accent")

    def calendar(self, wd: W, b: Box) -> None:
        x0, y0, x1, y1 = b
        events: dict[int, list[str]] = wd.value
        self.text((x0 + 4, y0), wd.label, font=BIG)
        days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
        cw, top = (x1 - x0) // 7, y0 + 22
        rh = (y1 - top - 16) // 6
        for i, name in enumerate(days):
            self.text((x0 + i * cw + 4, top), name, "muted", SMALL)
        first = int(wd.selected or 0)  # weekday index of day 1
        for day in range(1, 32):
            cell = first + day - 1
            r, c = divmod(cell, 7)
            cb = (x0 + c * cw, top + 16 + r * rh, x0 + (c + 1) * cw, top + 16 + (r + 1) * rh)
            self.box(cb, "white", "grey3")
            self.text((cb[0] + 3, cb[1] + 2), str(day), "muted", SMALL)
            for k, ev in enumerate(events.get(day, [])[-1:]):  # the newest event of the day
                eb = (cb[0] + 2, cb[1] + 15 + 15 * k, cb[2] - 2, cb[1] + 29 + 15 * k)
                self.box(eb, "lightblue2", None)
                self.text((eb[0] + 2, eb[1]), self.fit(ev, cw - 8, SMALL, keep_start=True), "black", SMALL)
            self.rects[f"{wd.name}:{day}"] = cb


def paint(screen: Screen) -> Painter:
    """Draw ``screen``; the Painter holds the RGB frame (``img``) and the clickable ``rects`` by name."""
    p = Painter()
    p.screen(screen)
    return p


def render(screen: Screen) -> tuple[bytes, dict[str, Box]]:
    """Draw ``screen``; return the PNG bytes and the clickable rectangles by name."""
    p = paint(screen)
    return png_bytes(p.img), p.rects
