"""The docs site cannot drift from the code: the generated reference pages equal what the code generates
now, every dotted ``optimizer.…`` name in the docs and the README resolves, every page is in the nav and
every nav entry is a page, every figure include names a file the benchmark scripts write.

(`bash scripts/docs` builds the site in strict mode, which fails on a broken link, anchor or include;
`bash scripts/test` runs both.)
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gendocs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# A dotted name in prose or code: optimizer.stats.decision, `optimizer.trust.certify.Certificate`, ...
DOTTED = re.compile(r"(?<![\w/.])optimizer(?:\.[A-Za-z_]\w*)+")


def doc_files() -> list[Path]:
    """The README and every Markdown file under docs/ (the figures included)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def resolves(name: str) -> bool:
    """``name`` is an importable module, or an attribute (chain) of the longest importable prefix."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(gendocs.PAGES))
def test_reference_page_is_what_the_code_generates(page: str) -> None:
    path = ROOT / gendocs.REFERENCE / page
    assert path.is_file(), f"{path} is missing: run `bash scripts/docs gen`"
    assert path.read_text(encoding="utf-8") == gendocs.PAGES[page](), (
        f"{path} differs from what the code generates: run `bash scripts/docs gen` and commit it"
    )


@pytest.mark.slow
def test_gendocs_check_passes_on_the_checked_in_pages() -> None:
    # `python -m tools.gendocs --check` in a subprocess, as a person or CI runs it.
    done = subprocess.run(
        [sys.executable, "-m", "tools.gendocs", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_an_option_added_without_regenerating_makes_the_cli_page_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import optimizer.cli

    real = optimizer.cli.build_parser

    def with_a_new_option() -> argparse.ArgumentParser:
        parser = real()
        for name, _help, sub in gendocs.cli_commands_of(parser):
            if name == "judgeloop eval":
                sub.add_argument("--new-option", help="an option nobody documented")
        return parser

    monkeypatch.setattr(optimizer.cli, "build_parser", with_a_new_option)
    assert gendocs.stale_pages() == ["cli.md"]
    assert "`--new-option`" in gendocs.cli_reference()


def test_cli_reference_lists_every_command_and_option() -> None:
    from optimizer.cli import build_parser

    text = (ROOT / gendocs.REFERENCE / "cli.md").read_text(encoding="utf-8")
    for name, _help, parser in gendocs.cli_commands():
        assert f"## {name}\n" in text
        for action in gendocs.command_options(parser, frozenset({"workspace"})):
            for flag in action.option_strings:
                assert f"`{flag}`" in text
    assert "`--version`" in text and build_parser().prog == "judgeloop"


def test_config_reference_lists_every_key_with_a_description() -> None:
    text = (ROOT / gendocs.REFERENCE / "config.md").read_text(encoding="utf-8")
    keys = gendocs.config_keys()
    assert len(keys) >= 48  # the count of judgeloop.toml keys when it was filed, judge.toml's beside
    for key in keys:
        assert f"| `{key.rsplit(' ', 1)[-1]}` |" in text, key


def test_every_dotted_optimizer_name_in_the_docs_resolves() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in doc_files()
        for name in sorted(set(DOTTED.findall(path.read_text(encoding="utf-8"))))
        if not resolves(name)
    ]
    assert not missing, "names in the docs that resolve to no module or attribute:\n" + "\n".join(missing)


def test_a_name_that_does_not_resolve_is_caught() -> None:
    assert resolves("optimizer.stats.decision") and resolves("optimizer.trust.certify.Certificate")
    assert not resolves("optimizer.stats.no_such_module") and not resolves(
        "optimizer.workspace.config.NoSuchName"
    )
    assert DOTTED.findall(
        "see `optimizer.workspace.paths.prompt_file`, not optimizer/workspace/paths.py"
    ) == ["optimizer.workspace.paths.prompt_file"]


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names (``- Title: path.md`` lines)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s*- .*?(?<![\w./-])([\w./-]+\.md)\s*$", nav, flags=re.MULTILINE)


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    pages = {
        p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if p.parts[len(DOCS.parts)] != "figures"
    }
    listed = nav_pages()
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"
    assert not set(listed) - pages, f"nav entries with no page: {sorted(set(listed) - pages)}"
    assert not pages - set(listed), f"pages not in the nav: {sorted(pages - set(listed))}"


def test_every_figure_is_included_and_every_include_exists() -> None:
    figures = {p.name for p in (DOCS / "figures").glob("*.md")}
    included = {
        m
        for path in DOCS.rglob("*.md")
        for m in re.findall(r'^--8<-- "figures/([\w.-]+)"', path.read_text(), flags=re.MULTILINE)
    }
    assert included == figures, (
        f"not included: {sorted(figures - included)}; missing: {sorted(included - figures)}"
    )


def test_readme_stays_short() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300 and len(text.split()) <= 3000
    # CI and the checks call these two exactly as the README shows them.
    assert "bash scripts/demo" in text and "bash scripts/test" in text


def test_a_benchmark_writes_its_printed_figures_as_the_include_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import _figures

    monkeypatch.setattr(_figures, "FIGURES", tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmarks/demo.py"])

    def main(argv: list[str]) -> int:
        print(f"a table for {argv}")
        return 0

    assert _figures.with_docs_figure(main, ["--runs", "3", "--write-docs", "demo-table"]) == 0
    text = (tmp_path / "demo-table.md").read_text(encoding="utf-8")
    assert "`python benchmarks/demo.py --runs 3 --write-docs demo-table`" in text
    assert "```text\na table for ['--runs', '3']\n```" in text
    # A failed run leaves the include file as it was.
    assert _figures.with_docs_figure(lambda argv: 1, ["--write-docs", "failed"]) == 1
    assert not (tmp_path / "failed.md").exists()


def test_readme_links_into_the_site_resolve() -> None:
    # The strict build checks links between pages; the README lies outside docs/, so it is checked here.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert len(targets) > 20
    assert not [t for t in targets if not (ROOT / t).is_file()]
