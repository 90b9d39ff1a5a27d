"""The workspace behind docs/screenshots/helped.png: three hand edits judged one run each
(`judgeloop run --strategy manual --policy literal`) against `MarkerJudge` — marker A, marker B, then
harmless notes until the literal policy keeps one by chance — and `judgeloop attribute` over HEAD's
history. Usage: ``python -m tests.support.attribution_demo DIR`` (OPENAI_API_KEY set to any value)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from optimizer.cli import main
from optimizer.ledger import Ledger
from tests.support.attribution import MARKER_A, MARKER_B, NOOP_NOTES, MarkerJudge
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import add_small_dev_split, make_workspace


def hand_edit(root: Path, line: str, at: int) -> None:
    path = root / "prompts" / "rubric.md"
    lines = path.read_text(encoding="utf-8").split("\n")
    headings = [i for i, t in enumerate(lines) if t.startswith("#")]
    lines.insert(headings[at] + 1, f"\n- {line}")
    path.write_text("\n".join(lines), encoding="utf-8")


def build(target: Path) -> int:
    root = make_workspace(Path(tempfile.mkdtemp(dir=target.parent)))
    root.rename(target)
    add_small_dev_split(target)
    judge = MarkerJudge(target)
    with FakeLLMServer(default=judge) as server:
        common = [
            "-w",
            str(target),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--policy",
            "literal",
        ]
        edits = [
            (MARKER_A, 0, "the alpha rule: every named value"),
            (MARKER_B, 1, "the bravo rule: no side effects"),
        ]
        edits += [(note, 2 + i, f"a harmless note: {note.lower()}") for i, note in enumerate(NOOP_NOTES)]
        for line, at, why in edits:
            hand_edit(target, line, at)
            assert main(["run", "--strategy", "manual", "-m", why, *common]) == 0
            with Ledger(target / "experiments" / "ledger.sqlite") as led:
                run = led.latest_run()
                kept = run is not None and any(e.status == "kept" for e in led.experiments(run.id))
            if at >= 2 and kept:
                break
        return main(["attribute", *common[:-2]])


if __name__ == "__main__":
    sys.exit(build(Path(sys.argv[1]).resolve()))
