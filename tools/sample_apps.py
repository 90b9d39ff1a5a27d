"""The sample set's apps and their scripts (`tools/samplegen.py`): a `Recorder` captures the screen before
each scripted action, then applies its effect; one `script_*` per app takes the variant's parameters."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tools.sample_desktop import (
    SHAPE_COLORS,
    Dialog,
    Painter,
    Screen,
    W,
    paint,
    png_bytes,
)

# ---------------------------------------------------------------------------------------------------
# Recording: every action captures the screen before it, then the script applies the effect.


@dataclass
class Recording:
    recording_id: str
    steps: list[dict[str, Any]]
    frames: list[bytes]


class Recorder:
    """Turns scripted actions on a Screen into steps with coordinates, timestamps and screenshots."""

    def __init__(self, screen: Screen, rng: random.Random) -> None:
        self.s = screen
        self.rng = rng
        self.steps: list[dict[str, Any]] = []
        self.frames: list[bytes] = []
        self.t_us = rng.randint(800, 2500) * 1000
        self._painted: Painter | None = None  # the current screen, painted by at() for the next capture

    def _capture(self, action_type: str, params: dict[str, Any], duration_ms: int) -> None:
        painted = self._painted or paint(self.s)
        self._painted = None
        self.frames.append(png_bytes(painted.img))
        self.steps.append(
            {
                "step_id": len(self.steps),
                "action": {"type": action_type, "parameters": params},
                "timestamp_us": self.t_us,
            }
        )
        self.t_us += (duration_ms + self.rng.randint(150, 900)) * 1000

    def at(self, name: str) -> tuple[int, int]:
        """A jittered point inside the rectangle called ``name`` on the current screen."""
        self._painted = paint(self.s)
        x0, y0, x1, y1 = self._painted.rects[name]
        return ((x0 + x1) // 2 + self.rng.randint(-3, 3), (y0 + y1) // 2 + self.rng.randint(-2, 2))

    def click(self, name: str, button: str = "left", clicks: int = 1) -> None:
        x, y = self.at(name)
        params: dict[str, Any] = {"x": x, "y": y, "button": button}
        if clicks > 1:
            params["num_clicks"] = clicks
        self._capture("click", params, self.rng.randint(500, 1800))

    def type(self, text: str) -> None:
        self._capture("type", {"text": text}, 300 + 70 * len(text))

    def press(self, *keys: str) -> None:
        self._capture("press", {"keys": list(keys)}, self.rng.randint(200, 600))

    def hotkey(self, *keys: str) -> None:
        self._capture("hotkey", {"keys": list(keys)}, self.rng.randint(300, 800))

    def scroll(self, name: str, direction: str, amount: int) -> None:
        x, y = self.at(name)
        self._capture("scroll", {"x": x, "y": y, "direction": direction, "amount": amount}, 400)

    def drag(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        self._capture(
            "drag",
            {"start_x": start[0], "start_y": start[1], "end_x": end[0], "end_y": end[1]},
            self.rng.randint(700, 1500),
        )

    def wait(self, seconds: float) -> None:
        self._capture("wait", {"duration_s": seconds}, int(seconds * 1000))

    # -- common idioms: one action plus its effect ---------------------------------------------------
    def fill(self, name: str, text: str, replace: bool = False) -> None:
        """Click a field, (select all,) type ``text`` into it."""
        self.click(name)
        self.s.focus(name)
        if replace:
            self.hotkey("Ctrl", "a")
            self.s.w(name).value = ""
        self.type(text)
        self.s.w(name).value = str(self.s.w(name).value) + text

    def choose(self, name: str, option: str) -> None:
        """Open a dropdown and click one of its options."""
        self.click(name)
        self.s.w(name).open = True
        self.click(f"{name}:{option}")
        self.s.w(name).open = False
        self.s.w(name).value = option

    def tick(self, minutes: int = 1) -> None:
        h, m = map(int, self.s.clock.split(":"))
        m += minutes
        self.s.clock = f"{(h + m // 60) % 24:02d}:{m % 60:02d}"


# ---------------------------------------------------------------------------------------------------
# Apps and their scripts. Each script takes a Recorder and the variant's parameters.


def _btn(name: str, label: str, primary: bool = False) -> W:
    return W("button", name, label=label, value=primary)


def script_mail(rec: Recorder, to: str, subject: str, body: str, cc: str = "", attach: str = "") -> None:
    """Compose and send an e-mail; finish on the Sent folder showing recipient and subject."""
    inbox = [
        ("Dana Okafor", "Weekly sync notes", "Mon"),
        ("IT Desk", "Password expiry", "Mon"),
        ("Sam Lee", "Lunch on Friday?", "Sun"),
    ]
    s = rec.s
    s.app, s.title, s.menu = "Mail", "Inbox - Mail", ["File", "Edit", "View", "Message", "Help"]
    s.toolbar = [_btn("new", "New message"), _btn("reply", "Reply"), _btn("delete", "Delete")]
    s.sidebar = W("list", "folders", value=["Inbox", "Drafts", "Sent", "Trash"], selected="Inbox")
    s.body = [
        W("list", "messages", label="msgs", value=inbox, options=["From", "Subject", "Date"], height=270)
    ]
    rec.click("new")
    s.title = "New message - Mail"
    s.toolbar = [_btn("send", "Send"), _btn("attach", "Attach..."), _btn("discard", "Discard")]
    s.body = [
        W("field", "to", "To"),
        W("field", "cc", "Cc"),
        W("field", "subject", "Subject"),
        W("text", "attachments", value="Attachments: none", height=18),
        W("textarea", "body", height=150),
    ]
    rec.fill("to", to)
    if cc:
        rec.fill("cc", cc)
    rec.fill("subject", subject)
    s.title = f"{subject} - Mail"
    lines = body.split("\n")
    rec.click("body")
    s.focus("body")
    for i, line in enumerate(lines):
        if i:
            rec.press("Enter")
            s.w("body").value += "\n"
        rec.type(line)
        s.w("body").value += line
    if attach:
        rec.click("attach")
        files = [("budget_q3.xlsx", "18 KB"), ("report.pdf", "240 KB"), ("photo.jpg", "1.2 MB")]
        s.dialog = Dialog(
            "Attach file",
            [W("list", "pick", label="files", value=files, options=["Name", "Size"], height=100)],
            [_btn("cancel", "Cancel"), _btn("open", "Open", True)],
        )
        rec.click(f"pick:{attach}")
        s.w("pick").selected = attach
        rec.click("open")
        s.dialog = None
        s.w("attachments").value = f"Attachments: {attach}"
    rec.click("send")
    rec.tick(2)
    s.title, s.status = "Inbox - Mail", f"Message sent to {to}"
    s.toolbar = [_btn("new", "New message"), _btn("reply", "Reply"), _btn("delete", "Delete")]
    s.body = [
        W("list", "messages", label="msgs", value=inbox, options=["From", "Subject", "Date"], height=270)
    ]
    rec.wait(1.0)
    rec.click("folders:Sent")
    s.sidebar.selected = "Sent"
    s.title = "Sent - Mail"
    sent_to = to + (f", cc {cc}" if cc else "")
    s.body = [
        W(
            "list",
            "messages",
            label="msgs",
            value=[(sent_to, subject + (" [attachment]" if attach else ""), "Today")],
            options=["To", "Subject", "Date"],
            selected=sent_to,
            height=60,
        ),
        W("text", "preview", value=f"To: {to}" + (f"    Cc: {cc}" if cc else "")),
        W("text", "preview2", value=f"Subject: {subject}"),
        W("text", "preview3", value=f"Attachments: {attach or 'none'}"),
        W("textarea", "shown", value=body, height=90),
    ]
    rec.wait(1.5)


def script_editor(rec: Recorder, lines: list[str], filename: str, folder: str, fmt: str) -> None:
    """Type a note and save it through the Save As dialog with a name, folder and format."""
    s = rec.s
    s.app, s.title, s.menu = (
        "Text Editor",
        "Untitled 1 - Text Editor",
        ["File", "Edit", "View", "Tools", "Help"],
    )
    s.toolbar = [_btn("new", "New"), _btn("open", "Open"), _btn("save", "Save"), _btn("undo", "Undo")]
    s.body = [W("textarea", "doc", height=268)]
    rec.click("doc")
    s.focus("doc")
    for i, line in enumerate(lines):
        if i:
            rec.press("Enter")
            s.w("doc").value += "\n"
        rec.type(line)
        s.w("doc").value += line
    s.title = "*Untitled 1 - Text Editor"
    rec.hotkey("Ctrl", "Shift", "s")
    s.dialog = Dialog(
        "Save As",
        [
            W("field", "name", "Name", value="Untitled 1.txt"),
            W(
                "dropdown",
                "folder",
                "Folder",
                value="Home",
                options=["Home", "Documents", "Desktop", "Downloads"],
            ),
            W(
                "dropdown",
                "format",
                "Format",
                value="Plain text (.txt)",
                options=["Plain text (.txt)", "Markdown (.md)", "PDF (.pdf)", "Word (.docx)"],
            ),
        ],
        [_btn("cancel", "Cancel"), _btn("ok", "Save", True)],
    )
    rec.fill("name", filename, replace=True)
    rec.choose("folder", folder)
    rec.choose("format", fmt)
    rec.click("ok")
    s.dialog = None
    s.focus(None)
    s.title = f"{filename} - Text Editor"
    s.status = f"Saved ~/{folder}/{filename}  ({fmt})"
    rec.wait(1.0)


def script_draw(rec: Recorder, shapes: list[tuple[str, str]]) -> None:
    """Insert shapes on slide 2 by dragging, give each a fill colour, then save."""
    s = rec.s
    s.app, s.title, s.menu = "Slides", "pitch.odp - Slides", ["File", "Edit", "Insert", "Format", "Slide"]
    s.toolbar = [_btn("Rectangle", "Rectangle"), _btn("Ellipse", "Ellipse"), _btn("Triangle", "Triangle")]
    s.sidebar = W("list", "slides", value=["Slide 1", "Slide 2", "Slide 3"], selected="Slide 1")
    s.body = [
        W("dropdown", "fill", "Fill", value="none", options=list(SHAPE_COLORS)),
        W("canvas", "slide", value=[], height=236),
    ]
    rec.click("slides:Slide 2")
    s.sidebar.selected = "Slide 2"
    s.title = "pitch.odp - Slides - Slide 2"
    rects = paint(s).rects
    sx0, sy0, _sx1, _sy1 = rects["slide"]
    placements = [(sx0 + 40, sy0 + 30, sx0 + 170, sy0 + 150), (sx0 + 230, sy0 + 40, sx0 + 360, sy0 + 160)]
    canvas = s.w("slide")
    for (kind, color), box in zip(shapes, placements, strict=False):
        rec.click(kind)
        s.w(kind).value = True
        s.status = f"Draw a {kind.lower()}: drag on the slide"
        start = (box[0] + rec.rng.randint(-2, 2), box[1] + rec.rng.randint(-2, 2))
        end = (box[2] + rec.rng.randint(-2, 2), box[3] + rec.rng.randint(-2, 2))
        rec.drag(start, end)
        s.w(kind).value = False
        for shape in canvas.value:
            shape["selected"] = False
        canvas.value.append({"kind": kind, "box": (*start, *end), "fill": "grey3", "selected": True})
        s.w("fill").value = "grey3"
        s.status = f"{kind} selected"
        rec.choose("fill", color)
        canvas.value[-1]["fill"] = color
    rec.click("slide")  # deselect by clicking an empty part of the slide
    for shape in canvas.value:
        shape["selected"] = False
    s.status = "Ready"
    rec.hotkey("Ctrl", "s")
    s.status = "Saved pitch.odp"
    rec.wait(1.0)


def script_calendar(rec: Recorder, title: str, day: int, time: str, reminder: str) -> None:
    """Move from February to March, create an event with a title, date, time and reminder."""
    s = rec.s
    s.app, s.title, s.menu = "Calendar", "February 2026 - Calendar", ["File", "Edit", "View", "Go", "Help"]
    s.toolbar = [
        _btn("new", "New event"),
        _btn("today", "Today"),
        _btn("prev", "< Prev"),
        _btn("next", "Next >"),
    ]
    s.body = [
        W(
            "calendar",
            "month",
            label="February 2026",
            value={3: ["10:00 Dentist"], 17: ["Team offsite"]},
            selected=6,
            height=270,
        )
    ]
    rec.click("next")
    s.title = "March 2026 - Calendar"
    cal = s.w("month")
    cal.label, cal.value, cal.selected = "March 2026", {9: ["09:00 Standup"], 20: ["Payroll"]}, 6
    rec.click(f"month:{day}", clicks=2)
    s.dialog = Dialog(
        "New event",
        [
            W("field", "title", "Title"),
            W("field", "date", "Date", value=f"2026-03-{day:02d}"),
            W(
                "dropdown",
                "time",
                "Time",
                value="09:00",
                options=["09:00", "10:00", "11:00", "13:00", "14:00", "15:00"],
            ),
            W(
                "dropdown",
                "remind",
                "Reminder",
                value="None",
                options=["None", "10 minutes before", "1 hour before", "1 day before"],
            ),
        ],
        [_btn("cancel", "Cancel"), _btn("save", "Save", True)],
    )
    rec.fill("title", title)
    rec.choose("time", time)
    rec.choose("remind", reminder)
    rec.click("save")
    s.dialog = None
    cal.value = {**cal.value, day: [*cal.value.get(day, []), f"{time} {title}"]}
    s.status = f"Event saved: {title}, Mar {day} {time}, reminder: {reminder}"
    rec.wait(1.0)


EXPENSES = [("Hotel", 420), ("Flights", 610), ("Taxi", 48), ("Meals", 95), ("Train", 130)]


def script_sheet(rec: Recorder, formula: str, sort: str = "", bold_header: bool = False) -> None:
    """Fill an expense table, optionally sort it by cost, and write a total formula in B7."""
    s = rec.s
    s.app, s.title, s.menu = "Sheets", "expenses.ods - Sheets", ["File", "Edit", "View", "Data", "Format"]
    s.toolbar = [
        _btn("bold", "B"),
        _btn("sort_asc", "Sort A-Z"),
        _btn("sort_desc", "Sort Z-A"),
        _btn("sum", "Sum"),
    ]
    cells = {"A1": "Item", "B1": "Cost (EUR)"}
    for i, (item, cost) in enumerate(EXPENSES[:3], start=2):
        cells[f"A{i}"], cells[f"B{i}"] = item, str(cost)
    grid = W("grid", "g", value=cells, options=[set()], height=232)
    s.body = [W("field", "fx", "fx"), grid]
    s.status = "Sheet 1 of 1"
    for i, (item, cost) in enumerate(EXPENSES[3:], start=5):
        rec.click(f"g:A{i}")
        grid.selected, grid.focused = {f"A{i}"}, True
        rec.type(item)
        cells[f"A{i}"] = item
        rec.press("Tab")
        grid.selected = {f"B{i}"}
        rec.type(str(cost))
        cells[f"B{i}"] = str(cost)
        rec.press("Enter")
        grid.selected = {f"A{i + 1}"}
    if bold_header:
        rec.click("g:A1")
        grid.selected = {"A1"}
        rec.click("g:B1")  # shift-click is rendered as a plain click in this recorder
        grid.selected = {"A1", "B1"}
        rec.click("bold")
        grid.options[0] |= {"A1", "B1"}
    if sort:
        rects = paint(s).rects
        a2, b6 = rects["g:A2"], rects["g:B6"]
        rec.drag(((a2[0] + a2[2]) // 2, (a2[1] + a2[3]) // 2), ((b6[0] + b6[2]) // 2, (b6[1] + b6[3]) // 2))
        grid.selected = {f"{c}{r}" for c in "AB" for r in range(2, 7)}
        rec.click("menu:Data")
        s.context = (rects["menu:Data"][0], 41, ["Sort ascending", "Sort descending", "Filter..."])
        rec.click(f"ctx:Sort {sort}")
        s.context = None
        rows = sorted(EXPENSES, key=lambda r: r[1], reverse=sort == "descending")
        for i, (item, cost) in enumerate(rows, start=2):
            cells[f"A{i}"], cells[f"B{i}"] = item, str(cost)
        s.status = f"Sorted A2:B6 by column B, {sort}"
    rec.click("g:A7")
    grid.selected = {"A7"}
    rec.type("Total")
    cells["A7"] = "Total"
    rec.press("Tab")
    grid.selected = {"B7"}
    s.w("fx").value = ""
    rec.type(f"={formula}(B2:B6)")
    s.w("fx").value = f"={formula}(B2:B6)"
    cells["B7"] = f"={formula}(B2:B6)"
    rec.press("Enter")
    total = sum(c for _, c in EXPENSES)
    cells["B7"] = str(total) if formula == "SUM" else f"{total / len(EXPENSES):.2f}"
    grid.selected = {"B7"}
    rec.hotkey("Ctrl", "s")
    s.status = "Saved expenses.ods"
    rec.wait(1.0)


FILES = [
    ("report.pdf", "240 KB", "Document"),
    ("draft.docx", "31 KB", "Document"),
    ("old.log", "2 MB", "Log"),
    ("temp.log", "900 KB", "Log"),
    ("photo.jpg", "1.2 MB", "Image"),
    ("invoice_0412.pdf", "64 KB", "Document"),
    ("setup-2.4.exe", "38 MB", "Program"),
    ("slides.pptx", "5 MB", "Presentation"),
    ("song.mp3", "4 MB", "Audio"),
    ("backup.zip", "120 MB", "Archive"),
    ("IMG_2044.jpg", "2.3 MB", "Image"),
    ("readme.txt", "1 KB", "Text"),
]


def _files_screen(s: Screen, folder: str, contents: dict[str, list[tuple[str, str, str]]]) -> None:
    s.title = f"{folder} - Files"
    s.sidebar = W("list", "places", value=list(contents), selected=folder)
    s.body = [
        W("field", "path", "Location", value=f"/home/kim/{folder}"),
        W(
            "list",
            "files",
            label="files",
            value=list(contents[folder]),
            options=["Name", "Size", "Type"],
            height=236,
        ),
    ]


def script_files(rec: Recorder, move_to: str = "", rename: str = "", delete: Sequence[str] = ()) -> None:
    """File management in Downloads: move, rename or delete; finish by showing the result."""
    s = rec.s
    s.app, s.menu = "Files", ["File", "Edit", "View", "Go", "Help"]
    s.toolbar = [
        _btn("back", "<"),
        _btn("up", "Up"),
        _btn("newfolder", "New folder"),
        _btn("search", "Search"),
    ]
    contents: dict[str, list[tuple[str, str, str]]] = {
        "Downloads": list(FILES),
        "Documents": [("cv.pdf", "88 KB", "Document")],
        "Archive": [("2024-taxes.pdf", "1 MB", "Document")],
        "Projects": [("plan.md", "4 KB", "Text")],
        "Trash": [],
    }
    _files_screen(s, "Downloads", contents)
    rec.click("places:Downloads")
    rec.scroll("files", "down", 60)  # look over the whole folder first, as people do
    s.w("files").offset = 3
    rec.scroll("files", "up", 60)
    s.w("files").offset = 0
    if move_to:
        rec.click("files:report.pdf")
        s.w("files").selected = "report.pdf"
        rects = paint(s).rects
        src, dst = rects["files:report.pdf"], rects[f"places:{move_to}"]
        rec.drag((src[0] + 40, (src[1] + src[3]) // 2), ((dst[0] + dst[2]) // 2, (dst[1] + dst[3]) // 2))
        item = next(f for f in contents["Downloads"] if f[0] == "report.pdf")
        contents["Downloads"].remove(item)
        contents[move_to].append(item)
        _files_screen(s, "Downloads", contents)
        s.status = f"Moved report.pdf to {move_to}"
        rec.wait(0.5)
        rec.click(f"places:{move_to}")
        _files_screen(s, move_to, contents)
        s.w("files").selected = "report.pdf"
    if rename:
        rec.click("files:draft.docx", button="right")
        s.w("files").selected = "draft.docx"
        r = paint(s).rects["files:draft.docx"]
        s.context = (r[0] + 60, r[3], ["Open", "Rename...", "Copy", "Move to Trash"])
        rec.click("ctx:Rename...")
        s.context = None
        s.dialog = Dialog(
            "Rename",
            [W("field", "newname", "New name", value="draft.docx")],
            [_btn("cancel", "Cancel"), _btn("ok", "Rename", True)],
        )
        rec.fill("newname", rename, replace=True)
        rec.press("Enter")
        s.dialog = None
        contents["Downloads"] = [
            (rename, *f[1:]) if f[0] == "draft.docx" else f for f in contents["Downloads"]
        ]
        _files_screen(s, "Downloads", contents)
        s.w("files").selected = rename
        s.status = f"Renamed draft.docx to {rename}"
    for name in delete:
        rec.click(f"files:{name}")
        s.w("files").selected = name
        rec.press("Delete")
        s.dialog = Dialog(
            "Move to Trash?",
            [W("text", "q", value=f'Move "{name}" to the Trash?')],
            [_btn("cancel", "Cancel"), _btn("ok", "Move to Trash", True)],
        )
        rec.click("ok")
        s.dialog = None
        item = next(f for f in contents["Downloads"] if f[0] == name)
        contents["Downloads"].remove(item)
        contents["Trash"].append(item)
        _files_screen(s, "Downloads", contents)
        s.status = f"Moved {name} to the Trash"
    if delete:
        rec.click("places:Trash")
        _files_screen(s, "Trash", contents)
    rec.wait(1.0)


def script_settings(rec: Recorder, theme: str = "", timezone: str = "", volume: int = -1) -> None:
    """System settings: set the theme, the time zone or the output volume."""
    s = rec.s
    s.app, s.title, s.menu = "Settings", "Settings", ["Settings", "Help"]
    s.toolbar = [_btn("back", "<"), _btn("search", "Search settings")]
    pages = ["Network", "Sound", "Appearance", "Date & Time", "Privacy"]
    s.sidebar = W("list", "pages", value=pages, selected="Network")
    s.body = [
        W("text", "h", label="big", value="Network"),
        W("toggle", "wifi", "Wi-Fi", value=True),
        W("text", "ssid", value="Connected to HomeNet-5G"),
    ]
    keyword, page = (
        ("theme", "Appearance")
        if theme
        else ("time zone", "Date & Time")
        if timezone
        else ("volume", "Sound")
    )
    rec.click("search")
    s.w("search").value = True
    s.status = "Search settings: |"
    rec.type(keyword)
    s.status = f"Search settings: {keyword}|"
    rec.press("Enter")
    s.status = f"Search settings: {keyword}  -  1 result: {page}"
    s.w("search").value = False
    rec.wait(0.5)
    if theme:
        rec.click("pages:Appearance")
        s.sidebar.selected = "Appearance"
        s.body = [
            W("text", "h", label="big", value="Appearance"),
            W("dropdown", "theme", "Theme", value="Light", options=["Light", "Dark", "High contrast"]),
            W("dropdown", "accent", "Accent", value="blue", options=["blue", "green", "purple"]),
            W("toggle", "anim", "Animations", value=True),
        ]
        rec.choose("theme", theme)
        s.status = f"Theme: {theme}"
        s.title = f"Settings - Appearance ({theme})"
        s.body.append(W("text", "preview", value=f"Preview: windows now use the {theme.lower()} theme"))
        rec.click("anim")
        s.w("anim").value = False
    if timezone:
        rec.click("pages:Date & Time")
        s.sidebar.selected = "Date & Time"
        s.body = [
            W("text", "h", label="big", value="Date & Time"),
            W("toggle", "auto", "Automatic", value=True),
            W("field", "tz", "Time zone", value="UTC"),
        ]
        rec.click("auto")
        s.w("auto").value = False
        rec.fill("tz", timezone.split("/")[1][:3], replace=True)
        zones = [
            z
            for z in ("Europe/Berlin", "Europe/London", "Europe/Lisbon", "Europe/Belgrade")
            if z.split("/")[1].startswith(timezone.split("/")[1][:3])
        ]
        s.body.append(
            W("list", "matches", label="zones", value=zones, options=["Matching time zones"], height=70)
        )
        rec.click(f"matches:{timezone}")
        s.body.pop()
        s.w("tz").value = timezone
        s.focus(None)
        rec.tick(60 if timezone == "Europe/Berlin" else 0)
        s.status = f"Time zone set to {timezone}"
    if volume >= 0:
        rec.click("pages:Sound")
        s.sidebar.selected = "Sound"
        s.body = [
            W("text", "h", label="big", value="Sound"),
            W("dropdown", "out", "Output", value="Speakers", options=["Speakers", "Headphones"]),
            W("slider", "vol", "Volume", value=50),
            W("toggle", "mute", "Mute", value=False),
        ]
        rects = paint(s).rects
        x0, y0, x1, y1 = rects["vol"]
        rec.drag((x0 + (x1 - x0) // 2, (y0 + y1) // 2), (x0 + (x1 - x0) * volume // 100, (y0 + y1) // 2))
        s.w("vol").value = volume
        s.status = f"Output volume {volume}%"
        rec.press("Tab")
    rec.wait(1.0)


SCRIPTS: dict[str, Callable[..., None]] = {
    "mail": script_mail,
    "editor": script_editor,
    "draw": script_draw,
    "calendar": script_calendar,
    "sheet": script_sheet,
    "files": script_files,
    "settings": script_settings,
}
APP_INFO: dict[str, tuple[str, str, list[str]]] = {  # category, subcategory, applications
    "mail": ("Communication", "Email", ["Mail"]),
    "editor": ("Office", "Text editing", ["Text Editor"]),
    "draw": ("Office", "Presentations", ["Slides"]),
    "calendar": ("Productivity", "Scheduling", ["Calendar"]),
    "sheet": ("Office", "Spreadsheets", ["Sheets"]),
    "files": ("System", "File management", ["Files"]),
    "settings": ("System", "Settings", ["Settings"]),
}
