from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.loop.guards import (
    PROTECTED_BEGIN,
    PROTECTED_END,
    changed_line_count,
    check_candidate,
    instruction_ngrams,
    protected_regions,
)

ALLOWED = ["prompts/judge.md", "prompts/rubric.md"]
TRAJ_ID = "3f2b9c1e-7a4d-4e0b-9a51-0c2d4e6f8a10"
RECORDING_ID = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
INSTRUCTION = (
    "Open the spreadsheet in LibreOffice Calc, sort the second column in descending order, "
    "and save it as a CSV file on the Desktop."
)

JUDGE = f"""# Judge

Decide whether the agent completed the instruction.

{PROTECTED_BEGIN}
Answer with JSON: {{"success": bool, "reasoning": str}}.
{PROTECTED_END}

## Notes
- Read every step.
"""


def check(changed: dict[str, tuple[str | None, str | None]], *, max_lines: int = 200):
    return check_candidate(changed, ALLOWED, max_lines, {TRAJ_ID}, {RECORDING_ID}, [INSTRUCTION])


def test_a_fine_edit_passes() -> None:
    new = JUDGE + "- A saved file must exist at the path the instruction names.\n"
    result = check({"prompts/judge.md": (JUDGE, new)})
    assert result.ok and result.guard == "ok" and result.reason == ""


def test_a_new_allowed_file_passes() -> None:
    assert check({"prompts/rubric.md": (None, "# Rubric\n- Prefer evidence in the last screenshot.\n")}).ok


def test_empty_candidate_is_rejected() -> None:
    result = check({"prompts/judge.md": (JUDGE, JUDGE)})
    assert not result.ok and result.guard == "empty" and result.reason == "the candidate changes nothing"


def test_file_outside_allowed_is_rejected_by_name() -> None:
    result = check({"prompts/judge.md": (JUDGE, JUDGE + "x\n"), "judgeloop.toml": ("a", "b")})
    assert result.guard == "allowed_files"
    assert result.reason.startswith("the candidate changes judgeloop.toml, outside the allowed files")


def test_deleting_an_allowed_file_is_rejected() -> None:
    result = check({"prompts/rubric.md": ("# Rubric\n", None)})
    assert result.guard == "allowed_files" and "deletes prompts/rubric.md" in result.reason


def test_editing_a_protected_region_is_rejected() -> None:
    new = JUDGE.replace('"reasoning": str', '"reasoning": str, "score": int')
    result = check({"prompts/judge.md": (JUDGE, new)})
    assert result.guard == "protected"
    assert result.reason == "prompts/judge.md edits protected region 1 (starting at line 5)"


def test_removing_a_marker_is_rejected() -> None:
    new = JUDGE.replace(PROTECTED_END + "\n", "")
    result = check({"prompts/judge.md": (JUDGE, new)})
    assert result.guard == "protected" and "removes a protection marker" in result.reason and PROTECTED_END in result.reason


def test_adding_a_marker_is_rejected() -> None:
    new = JUDGE + f"{PROTECTED_BEGIN}\nmine\n{PROTECTED_END}\n"
    assert check({"prompts/judge.md": (JUDGE, new)}).guard == "protected"


def test_moving_text_around_a_protected_region_passes() -> None:
    new = JUDGE.replace("Decide whether", "Carefully decide whether")
    assert check({"prompts/judge.md": (JUDGE, new)}).ok


def test_diff_over_the_cap_is_rejected_with_counts() -> None:
    new = JUDGE + "".join(f"- rule {i}\n" for i in range(6))
    assert check({"prompts/judge.md": (JUDGE, new)}, max_lines=6).ok
    result = check({"prompts/judge.md": (JUDGE, new + "- one more\n")}, max_lines=6)
    assert result.guard == "diff_size"
    assert result.reason == "the candidate changes 7 lines (prompts/judge.md 7), over the cap of 6"


def test_changed_line_count_counts_replacements_twice() -> None:
    assert changed_line_count("a\nb\nc\n", "a\nB\nc\n") == 2
    assert changed_line_count(None, "a\nb\n") == 2
    assert changed_line_count("a\n", "a\n") == 0


@pytest.mark.parametrize("ident", [TRAJ_ID, TRAJ_ID.upper(), RECORDING_ID])
def test_dev_ids_are_rejected_case_insensitively(ident: str) -> None:
    new = JUDGE + f"- As in item {ident}, check the dialog.\n"
    result = check({"prompts/judge.md": (JUDGE, new)})
    assert result.guard == "overfit_id" and ident.lower() in result.reason.lower()
    assert result.reason.startswith("prompts/judge.md contains the dev id")


def test_an_id_already_present_does_not_block_other_edits() -> None:
    old = JUDGE + f"- legacy note about {TRAJ_ID}\n"
    assert check({"prompts/judge.md": (old, old + "- unrelated rule\n")}).ok


def test_copying_eight_instruction_words_is_rejected_with_the_quote() -> None:
    copied = "sort the second column in descending order, and save it"  # 10 words
    new = JUDGE + f"- Watch for tasks like: {copied.upper()}!\n"
    result = check({"prompts/judge.md": (JUDGE, new)})
    assert result.guard == "overfit_copy"
    assert result.reason == (
        "prompts/judge.md copies 10 words from a dev instruction: "
        "'sort the second column in descending order and save it'"
    )


def test_seven_words_are_not_a_copy() -> None:
    new = JUDGE + "- Check: sort the second column in descending order.\n"  # 7 instruction words
    assert check({"prompts/judge.md": (JUDGE, new)}).ok


def test_a_phrase_already_in_the_old_text_does_not_block_edits() -> None:
    phrase = "open the spreadsheet in libreoffice calc sort the second column"
    old = JUDGE + f"- Example: {phrase}\n"
    new = old.replace("Read every step.", "Read every step, including the last one.")
    assert check({"prompts/judge.md": (old, new)}).ok
    # ...but pasting it again elsewhere, extended with new copied words, is still caught
    extended = old + "- in descending order and save it as a csv file on the desktop\n"
    moved = extended.replace(f"- Example: {phrase}\n", "") + f"{phrase} in descending order and save\n"
    assert check({"prompts/judge.md": (old, moved)}).guard == "overfit_copy"


def test_prebuilt_ngram_set_is_accepted() -> None:
    grams = instruction_ngrams([INSTRUCTION])
    new = JUDGE + "open the spreadsheet in libreoffice calc sort the second\n"
    result = check_candidate({"prompts/judge.md": (JUDGE, new)}, ALLOWED, 200, set(), set(), grams)
    assert result.guard == "overfit_copy" and "copies 9 words" in result.reason


def test_protected_regions_extracts_in_order() -> None:
    text = f"a\n{PROTECTED_BEGIN}\none\n{PROTECTED_END}\nb\n{PROTECTED_BEGIN}\ntwo\n{PROTECTED_END}\n"
    assert [r.splitlines()[1] for r in protected_regions(text)] == ["one", "two"]


def test_bundled_judge_prompt_keeps_its_protected_region_under_a_fine_edit() -> None:
    bundled = Path(__file__).resolve().parents[1] / "prompts" / "judge.md"
    old = bundled.read_text(encoding="utf-8")
    assert PROTECTED_BEGIN in old, "the bundled judge prompt must fence its output contract"
    assert check({"prompts/judge.md": (old, old + "\n- Prefer the final screenshot as evidence.\n")}).ok
    region = protected_regions(old)[0]
    broken = old.replace(region, region.replace("\n", "\n\n", 1))
    assert check({"prompts/judge.md": (old, broken)}).guard == "protected"


# -- overfit_value: the concrete values of dev instructions --------------------------------------

VALUE_INSTRUCTIONS = [
    "Email alice@example.com with the subject 'Q3 numbers' telling her the numbers are ready.",
    'Rename final_v2.docx to report.pdf in the "Budget Review" folder and set the alarm to 14:30.',
    "Turn on Wi-Fi, e.g. from the top bar, and don't change anything else.",
]


def value_check(old: str, new: str):
    return check_candidate({"prompts/rubric.md": (old, new)}, ALLOWED, 200, set(), set(), VALUE_INSTRUCTIONS)


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("- A mail to ALICE@example.com is a failure.\n", "alice@example.com"),
        ("- If the file is report.pdf, say false.\n", "report.pdf"),
        ("- Renaming final_v2.docx is wrong.\n", "final_v2.docx"),
        ("- An alarm at 14:30 means success.\n", "14:30"),
        ("- The subject must be q3 numbers.\n", "q3 numbers"),
        ("- Anything in the budget   review folder counts.\n", "budget review"),
    ],
)
def test_a_dev_instruction_value_is_rejected_by_name(line: str, value: str) -> None:
    result = value_check("# Rubric\n", "# Rubric\n" + line)
    assert result.guard == "overfit_value"
    assert result.reason == (
        f"prompts/rubric.md names {value!r}, a value from a dev instruction; write rules that hold for any value"
    )


@pytest.mark.parametrize(
    "line",
    [
        "- Check every file name, e-mail address and time the instruction gives, character by character.\n",
        "- Turning on Wi-Fi when asked for Bluetooth is a Critical Mistake.\n",  # hyphenated words are not values
        "- e.g. a report saved as PDF instead of DOCX is wrong.\n",
        "- A subject line with different numbers is a failure.\n",
        "- myreport.pdf2 is not the same value as another file.\n",  # only whole tokens count
    ],
)
def test_general_rules_are_not_values(line: str) -> None:
    assert value_check("# Rubric\n", "# Rubric\n" + line).ok


def test_a_value_already_in_the_prompt_does_not_block_other_edits() -> None:
    old = "# Rubric\n- Example: saving report.pdf as report.txt is wrong.\n"
    assert value_check(old, old + "- Read the last screenshot.\n").ok
    assert value_check(old, old + "- And report.pdf again.\n").guard == "overfit_value"


def test_bundled_library_entries_name_no_value_of_the_sample_instructions(tmp_path: Path) -> None:
    from optimizer.devset.split import open_split
    from optimizer.judge.prompts import PromptSet
    from optimizer.loop.guards import instruction_values, new_value
    from optimizer.scaffold import init_workspace

    root = Path(__file__).resolve().parents[1]
    ws = init_workspace(tmp_path / "ws", sample=True)
    split = open_split(ws, "sample")
    values = instruction_values(split.trajectory(t).task.instruction for t in split.ids)
    assert {"alice@example.com", "final_v2.docx", "q3 numbers"} <= values
    prompts = PromptSet.from_dir(root / "prompts")
    for entry in prompts.library():
        assert new_value("", entry.text, values) is None, entry.id
    for name in ("judge.md", "rubric.md"):
        assert new_value("", (root / "prompts" / name).read_text(encoding="utf-8"), values) is None
