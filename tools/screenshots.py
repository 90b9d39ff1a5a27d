"""Rebuild the docs' TUI screenshots: ``bash scripts/docs screenshots [OUT_DIR]`` (default docs/screenshots).

Each screen is rendered by ``judgeloop tui --screenshot FILE.svg --screen NAME --size 120x36`` from a
workspace the test suite's helpers build with real runs against its fake judge (no key, no network;
docs/screenshots/README.md says which run each screen comes from), then converted to PNG with
``cairosvg`` when it is installed (``pip install cairosvg``; otherwise the SVGs are written and a line
says so). Takes a few minutes: the runs judge the 88-item sample.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZE = "120x36"


def _real_run(**options: object) -> Callable[[Path], None]:
    def build(ws: Path) -> None:
        from tests.support.tui_runs import make_real_run

        assert make_real_run(ws, **options) == 0  # type: ignore[arg-type]

    return build


def _attribution(ws: Path) -> None:
    from tests.support.attribution_demo import build

    assert build(ws) == 0


def _triage(ws: Path) -> None:
    from tests.support.triage import build

    build(ws.parent / "triage")
    (ws.parent / "triage" / "ws").rename(ws)


# workspace builder, then (file, screen, extra tui options) for each screen it shows
SCREENS: list[tuple[Callable[[Path], None], list[tuple[str, str, list[str]]]]] = [
    (
        _real_run(max_experiments=8, replicates=2, items=None, screenshots="none"),
        [
            ("history", "history", []),
            ("item", "item", []),
            ("experiment", "experiment", ["--experiment", "6"]),
        ],
    ),
    (_attribution, [("helped", "helped", [])]),
    (
        _real_run(max_experiments=9, replicates=2, items=None, screenshots="none", wave=3, futility=True),
        [("waves", "history", [])],
    ),
    (_triage, [("suspects", "suspects", [])]),
]


def render(ws: Path, out: Path, name: str, screen: str, extra: list[str]) -> Path:
    """``judgeloop tui --screenshot`` of one screen; returns the SVG written."""
    from optimizer.cli import main

    svg = out / f"{name}.svg"
    assert (
        main(["tui", "-w", str(ws), "--screenshot", str(svg), "--screen", screen, "--size", SIZE, *extra])
        == 0
    )
    return svg


def to_png(svg: Path) -> bool:
    """The PNG beside ``svg`` (cairosvg); False when cairosvg is not installed."""
    try:
        import cairosvg  # type: ignore[import-not-found]  # optional: pip install cairosvg
    except ImportError:
        return False
    cairosvg.svg2png(url=str(svg), write_to=str(svg.with_suffix(".png")))
    return True


def main(argv: list[str]) -> int:
    out = Path(argv[0]).resolve() if argv else ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-a-real-key")  # the fake server takes any key
    pngs = True
    with tempfile.TemporaryDirectory(prefix="judgeloop-screens-") as tmp:
        for index, (build, screens) in enumerate(SCREENS):
            ws = Path(tmp) / f"ws{index}" / "ws"
            ws.parent.mkdir()
            build(ws)
            for name, screen, extra in screens:
                svg = render(ws, out, name, screen, extra)  # `judgeloop tui` says "wrote FILE"
                pngs = to_png(svg) and pngs
    if not pngs:
        print(
            "cairosvg is not installed: SVGs only (pip install cairosvg, then run this again for the PNGs)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
