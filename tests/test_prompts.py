from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.judge.prompts import (
    LIBRARY_BEGIN,
    LIBRARY_END,
    PROTECTED_BEGIN,
    PROTECTED_END,
    JudgeSettings,
    LibraryEntry,
    PromptSet,
    enabled_entries,
    parse_library,
    protected_blocks,
    protected_line_ranges,
    with_entries,
)
from optimizer.judge.types import Sampling
from optimizer.models import MISTAKE_TYPES
from optimizer.workspace.workspace import JUDGELOOP_ACTOR, Workspace, repo_at

BUNDLED = Path(__file__).resolve().parents[1] / "prompts"


@pytest.fixture
def prompts_dir(tmp_path: Path) -> Path:
    target = tmp_path / "prompts"
    shutil.copytree(BUNDLED, target)
    return target


def test_bundled_prompts_load_and_render_a_clean_system_prompt() -> None:
    prompts = PromptSet.from_dir(BUNDLED)
    system = prompts.system_prompt()
    assert "# Rubric" in system and "# Output contract" in system
    assert system.index("# Rubric") < system.index("# Output contract")
    for mistake in MISTAKE_TYPES:
        assert mistake in system
    # Comments, markers and placeholders never reach the judge.
    assert "<!--" not in system and "{{" not in system and "judgeloop:" not in system
    assert "resized to 512x332 pixels" in system
    assert system.endswith("\n") and "\n\n\n" not in system


def test_bundled_judge_md_fences_the_output_contract() -> None:
    text = (BUNDLED / "judge.md").read_text()
    blocks = protected_blocks(text)
    assert len(blocks) == 1
    assert blocks[0].startswith(PROTECTED_BEGIN) and blocks[0].endswith(PROTECTED_END)
    assert "# Output contract" in blocks[0] and '"success"' in blocks[0]
    ((start, end),) = protected_line_ranges(text)
    lines = text.splitlines()
    assert lines[start - 1] == PROTECTED_BEGIN and lines[end - 1] == PROTECTED_END


def test_default_settings_match_the_published_direct_judge() -> None:
    settings = PromptSet.from_dir(BUNDLED).settings
    # The bundled judge.toml differs from a file without keys only in its (cache-friendly) layout.
    assert settings == JudgeSettings(layout="trajectory-first") and JudgeSettings().layout == "rubric-first"
    assert (settings.image_width, settings.image_height) == (512, 332)
    assert settings.mode == "direct" and settings.screenshots == "all" and settings.tiling is False
    assert settings.sampling() == Sampling(max_tokens=1024, temperature=None, top_p=None)


def test_every_judge_toml_key_is_documented_in_a_comment() -> None:
    text = (BUNDLED / "judge.toml").read_text()
    for key in JudgeSettings.model_fields:
        assert f"{key} =" in text or f"[{key}]" in text, key  # a table ([panel]) is documented by its header
    lines = text.splitlines()
    for key in JudgeSettings.model_fields:
        idx = next(
            i
            for i, line in enumerate(lines)
            if line.lstrip("# ").startswith(f"{key} =") or line.lstrip("# ") == f"[{key}]"
        )
        while idx > 0 and lines[idx - 1].strip():  # climb to the first line of the key's paragraph
            idx -= 1
        assert lines[idx].startswith("# "), f"{key} has no comment in its paragraph"


def test_unknown_placeholder_names_file_and_line(prompts_dir: Path) -> None:
    path = prompts_dir / "judge.md"
    lines = path.read_text().splitlines()
    lines.insert(20, "Use {{ instructions }} here.")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError) as err:
        PromptSet.from_dir(prompts_dir)
    message = str(err.value)
    assert f"{prompts_dir}/judge.md:21:" in message
    assert "{{ instructions }}" in message and "{{rubric}}" in message


def test_rubric_may_not_include_itself(prompts_dir: Path) -> None:
    path = prompts_dir / "rubric.md"
    path.write_text(path.read_text() + "\nSee {{rubric}}.\n")
    n = len(path.read_text().splitlines())
    with pytest.raises(UserError, match=rf"rubric.md:{n}: unknown placeholder \{{\{{rubric\}}\}}"):
        PromptSet.from_dir(prompts_dir)


def test_placeholders_inside_comments_are_ignored(prompts_dir: Path) -> None:
    path = prompts_dir / "judge.md"
    path.write_text("<!-- {{whatever}} -->\n" + path.read_text())
    assert "whatever" not in PromptSet.from_dir(prompts_dir).system_prompt()


def test_unclosed_protected_region_is_an_error_with_its_line(prompts_dir: Path) -> None:
    path = prompts_dir / "judge.md"
    text = path.read_text().replace(PROTECTED_END + "\n", "")
    path.write_text(text)
    line = text.splitlines().index(PROTECTED_BEGIN) + 1
    with pytest.raises(UserError, match=rf"judge.md:{line}: protected region is never closed"):
        PromptSet.from_dir(prompts_dir)


def test_missing_file_is_a_user_error(prompts_dir: Path) -> None:
    (prompts_dir / "judge.toml").unlink()
    with pytest.raises(UserError, match=r"judge\.toml is missing"):
        PromptSet.from_dir(prompts_dir)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('mode = "tools"\n', "[mode]"),
        ("max_images = 1\n", "[max_images]"),
        ('screenshots = "some"\n', "[screenshots]"),
        ("image_size = 3\n", "[image_size]"),
        ("every_k = 0\n", "[every_k]"),
        ("tiling = \n", "not valid TOML"),
    ],
)
def test_bad_judge_toml_is_one_clear_line(prompts_dir: Path, toml: str, message: str) -> None:
    (prompts_dir / "judge.toml").write_text(toml)
    with pytest.raises(UserError) as err:
        PromptSet.from_dir(prompts_dir)
    assert message in str(err.value) and "judge.toml" in str(err.value)
    assert "\n" not in str(err.value)


def test_settings_change_the_prompt_hash_and_screenshot_sentence(prompts_dir: Path) -> None:
    before = PromptSet.from_dir(prompts_dir)
    (prompts_dir / "judge.toml").write_text("tiling = true\ntemperature = 0.0\n")
    after = PromptSet.from_dir(prompts_dir)
    assert before.prompt_hash() != after.prompt_hash()
    assert "2x2 image" in after.system_prompt()
    assert after.settings.sampling().temperature == 0.0


def test_library_md_does_not_change_the_prompt_hash(prompts_dir: Path) -> None:
    before = PromptSet.from_dir(prompts_dir).prompt_hash()
    path = prompts_dir / "library.md"
    path.write_text(path.read_text() + "\n## lib-new-rule\n\nA new rule.\n")
    assert PromptSet.from_dir(prompts_dir).prompt_hash() == before


def test_from_rev_reads_the_committed_files_not_the_working_tree(empty_workspace: Workspace) -> None:
    ws = empty_workspace
    rubric = ws.prompts_dir / "rubric.md"
    original = rubric.read_text()
    with repo_at(ws.root) as repo:
        first = repo.head.commit.hexsha
    rubric.write_text(original.replace("# Rubric", "# Rubric v2"))
    with repo_at(ws.root) as repo:
        repo.index.add(["prompts/rubric.md"])
        repo.index.commit("edit rubric", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)
    rubric.write_text(original.replace("# Rubric", "# Rubric uncommitted"))

    assert "# Rubric v2" in PromptSet.from_rev(ws, "HEAD").system_prompt()
    old = PromptSet.from_rev(ws, first)
    assert old.rubric_md == original
    assert old.prompt_hash() == PromptSet.from_files(old.files).prompt_hash()
    assert "uncommitted" in PromptSet.from_dir(ws.prompts_dir).rubric_md
    with pytest.raises(UserError, match="unknown git revision 'no-such-branch'"):
        PromptSet.from_rev(ws, "no-such-branch")


def test_from_rev_names_the_revision_in_placeholder_errors(empty_workspace: Workspace) -> None:
    ws = empty_workspace
    path = ws.prompts_dir / "judge.md"
    path.write_text("Hello {{bogus}}\n" + path.read_text())
    with repo_at(ws.root) as repo:
        repo.index.add(["prompts/judge.md"])
        repo.index.commit("bad placeholder", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)
    with pytest.raises(UserError, match=r"prompts@HEAD/judge.md:1: unknown placeholder \{\{bogus\}\}"):
        PromptSet.from_rev(ws, "HEAD")


# --------------------------------------------------------------------------- library


def test_bundled_library_parses_into_unique_stable_ids() -> None:
    entries = PromptSet.from_dir(BUNDLED).library()
    assert 10 <= len(entries) <= 16
    ids = [e.id for e in entries]
    assert len(set(ids)) == len(ids) and all(i.startswith("lib-") for i in ids)
    assert "lib-final-state" in ids
    assert all(e.text and "\n" not in e.text for e in entries)


def test_library_parser_joins_paragraph_lines_and_ignores_the_preamble() -> None:
    text = "# Library\n\nDoc text.\n\n## lib-a\n\nFirst line\ncontinues here.\n\n## lib-b\nSecond.\n"
    assert parse_library(text) == [
        LibraryEntry("lib-a", "First line continues here."),
        LibraryEntry("lib-b", "Second."),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("## lib-a\nx\n## lib-a\ny\n", "library.md:3: library id lib-a repeats line 1"),
        ("## Final state\nx\n", "library.md:1: 'Final state' is not a library id"),
        ("## lib-a\n\n## lib-b\nx\n", "library.md:1: library entry lib-a has no text"),
        ("## lib-a\nx\n### sub\n", "library.md:3: only '## lib-id' headings"),
    ],
)
def test_bad_library_entries_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_library(text, "prompts/library.md")
    assert message in str(err.value)


def test_library_region_starts_empty_and_round_trips() -> None:
    prompts = PromptSet.from_dir(BUNDLED)
    library = prompts.library()
    assert enabled_entries(prompts.rubric_md) == []

    chosen = ["lib-neighbour-task", "lib-final-state"]
    rubric = with_entries(prompts.rubric_md, library, chosen)
    # Library order, not request order; everything outside the region is unchanged.
    assert enabled_entries(rubric) == ["lib-final-state", "lib-neighbour-task"]
    before, after = prompts.rubric_md.split(LIBRARY_BEGIN)
    assert rubric.startswith(before) and rubric.endswith(LIBRARY_END + after.split(LIBRARY_END)[1])

    again = with_entries(rubric, library, ["lib-final-state"])
    assert enabled_entries(again) == ["lib-final-state"]
    assert with_entries(again, library, []) == prompts.rubric_md


def test_enabled_entries_reach_the_system_prompt_as_bullets(prompts_dir: Path) -> None:
    prompts = PromptSet.from_dir(prompts_dir)
    library = {e.id: e for e in prompts.library()}
    rubric = with_entries(prompts.rubric_md, list(library.values()), ["lib-final-state"])
    (prompts_dir / "rubric.md").write_text(rubric)
    system = PromptSet.from_dir(prompts_dir).system_prompt()
    assert "## Additional rules" in system
    assert "- " + library["lib-final-state"].text in system
    assert "## Additional rules" not in prompts.system_prompt()


def test_with_entries_refuses_unknown_ids_and_rubrics_without_a_region() -> None:
    library = [LibraryEntry("lib-a", "A.")]
    with pytest.raises(ValueError, match="lib-zzz"):
        with_entries(f"{LIBRARY_BEGIN}\n{LIBRARY_END}\n", library, ["lib-zzz"])
    with pytest.raises(UserError, match="no library region"):
        enabled_entries("# Rubric\n")
