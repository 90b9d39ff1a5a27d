from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from optimizer.loop.guards import (
    PROTECTED_BEGIN,
    PROTECTED_END,
    DevMaterial,
    GuardResult,
    changed_line_count,
    check_candidate,
    instruction_ngrams,
    protected_regions,
)
from optimizer.models import Action, Step, Task, Trajectory

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


def check(changed: dict[str, tuple[str | None, str | None]], *, max_lines: int = 200) -> GuardResult:
    return check_candidate(changed, ALLOWED, max_lines, DevMaterial({TRAJ_ID}, {RECORDING_ID}, [INSTRUCTION]))


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
    assert (
        result.guard == "protected"
        and "removes a protection marker" in result.reason
        and PROTECTED_END in result.reason
    )


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


def test_prebuilt_ngram_set_is_accepted_with_its_values() -> None:
    from optimizer.loop.guards import instruction_values

    grams, values = (
        instruction_ngrams([*VALUE_INSTRUCTIONS, INSTRUCTION]),
        instruction_values(VALUE_INSTRUCTIONS),
    )
    new = JUDGE + "open the spreadsheet in libreoffice calc sort the second\n"
    result = check_candidate(
        {"prompts/judge.md": (JUDGE, new)}, ALLOWED, 200, DevMaterial(set(), set(), grams, values)
    )
    assert result.guard == "overfit_copy" and "copies 9 words" in result.reason
    # The value guard runs on this path too (it used to be skipped when no values were passed).
    result = check_candidate(
        {"prompts/judge.md": (JUDGE, JUDGE + "- report.pdf\n")},
        ALLOWED,
        200,
        DevMaterial(set(), set(), grams, values),
    )
    assert result.guard == "overfit_value" and "'report.pdf'" in result.reason


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


def value_check(old: str, new: str) -> GuardResult:
    return check_candidate(
        {"prompts/rubric.md": (old, new)}, ALLOWED, 200, DevMaterial(set(), set(), VALUE_INSTRUCTIONS)
    )


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


def test_bundled_prompts_and_library_pass_the_whole_lint_against_the_sample(tmp_path: Path) -> None:
    from optimizer.devset.labels import load_labels
    from optimizer.devset.split import open_split
    from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, PromptSet, with_entries
    from optimizer.loop.guards import instruction_values, new_value, trajectory_values
    from optimizer.scaffold import init_workspace

    root = Path(__file__).resolve().parents[1]
    ws = init_workspace(tmp_path / "ws", sample=True)
    split = open_split(ws, "sample")
    trajectories = [split.trajectory(t) for t in split.ids]
    instructions = [t.task.instruction for t in trajectories]
    values = instruction_values(instructions)
    typed = trajectory_values(trajectories)
    assert {"alice@example.com", "final_v2.docx", "q3 numbers"} <= values
    assert {"call the plumber before friday", "=sum(b2:b6"} <= typed and "dentist" not in typed
    prompts = PromptSet.from_dir(root / "prompts")
    for entry in prompts.library():
        assert new_value("", entry.text, values | typed) is None, entry.id
    for name in ("judge.md", "rubric.md"):
        assert new_value("", (root / "prompts" / name).read_text(encoding="utf-8"), values | typed) is None
    # The whole lint, ids and copies included, passes the bundled prompts with every library entry enabled.
    labels = load_labels(split)
    recordings = {lab.original_id for lab in labels.values()} | {
        lab.paired_id for lab in labels.values() if lab.paired_id
    }
    rubric = with_entries(prompts.files[RUBRIC_MD], prompts.library(), [e.id for e in prompts.library()])
    texts = {
        "prompts/judge.md": (root / "prompts" / "judge.md").read_text(encoding="utf-8"),
        RUBRIC_MD: rubric,
        LIBRARY_MD: prompts.files[LIBRARY_MD],
    }
    # Old = only the protected regions, so the protected guard passes and every other line is new to the lint.
    changed: dict[str, tuple[str | None, str | None]] = {
        path: ("\n".join(protected_regions(text)), text) for path, text in texts.items()
    }
    result = check_candidate(
        changed,
        list(changed),
        10_000,
        DevMaterial(split.ids, recordings, instructions, trajectory_values=typed),
    )
    assert result.ok, result.reason


# -- hostile spellings: the lint compares normalised text ---------------------------------------

ZWSP = "\u200b"


def test_a_zero_width_character_inside_an_id_is_rejected() -> None:
    obfuscated = TRAJ_ID[:8] + ZWSP + TRAJ_ID[8:20] + "\u2060" + TRAJ_ID[20:]
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- As in item {obfuscated}.\n")})
    assert result.guard == "overfit_id"
    assert (
        result.reason == f"prompts/judge.md contains the dev id {TRAJ_ID!r}; write rules, not item references"
    )


def test_an_id_without_hyphens_is_rejected() -> None:
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Item {TRAJ_ID.replace('-', '').upper()}.\n")})
    assert result.guard == "overfit_id" and TRAJ_ID in result.reason


def test_an_id_split_across_a_line_break_is_rejected() -> None:
    split = RECORDING_ID[:13] + "\n  " + RECORDING_ID[13:].replace("-", "_")
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Recording {split} is special.\n")})
    assert result.guard == "overfit_id" and RECORDING_ID in result.reason


def test_an_id_in_full_width_characters_is_rejected() -> None:
    full_width = "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in TRAJ_ID)
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Item {full_width}.\n")})
    assert result.guard == "overfit_id" and TRAJ_ID in result.reason


@pytest.mark.parametrize("prefix", ["3f2b9", "3f2b9c1e", "3F2B-9C1E-7a", "3f2b 9c1e"])
def test_a_prefix_of_an_id_is_rejected(prefix: str) -> None:
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Items starting {prefix} are negatives.\n")})
    compact = "".join(c for c in prefix.lower() if c.isalnum())
    assert result.guard == "overfit_id"
    assert result.reason == (
        f"prompts/judge.md contains {compact!r}, a prefix of the dev id {TRAJ_ID!r}; write rules, not item references"
    )


def test_an_id_prefix_needs_a_digit_so_ordinary_words_pass() -> None:
    ident = "decade1f-0b2c-4d3e-8f9a-0123456789ab"
    line = "- A decade of dates, a faded cafe: check every date the instruction gives.\n"

    def run(text: str) -> GuardResult:
        return check_candidate(
            {"prompts/judge.md": (JUDGE, JUDGE + text)}, ALLOWED, 200, DevMaterial({ident}, set(), [])
        )

    assert run(line).ok  # "decade", "faded", "cafe" are hex-ish words, but no digit: not an id reference
    assert run("- Four-digit codes like 2024 or 10000 are fine.\n").ok  # 4 digits, and no id starts 10000
    result = run("- Item decade1f is a negative.\n")
    assert result.guard == "overfit_id" and ident in result.reason


def test_a_short_prefix_is_not_an_id_reference() -> None:
    assert check({"prompts/judge.md": (JUDGE, JUDGE + "- Ids like 3f2b are opaque.\n")}).ok


def test_an_obfuscated_id_already_in_the_old_text_does_not_block_other_edits() -> None:
    old = JUDGE + f"- legacy {TRAJ_ID.replace('-', ZWSP)}\n"
    assert check({"prompts/judge.md": (old, old + "- unrelated rule\n")}).ok
    moved = f"- legacy {TRAJ_ID}\n" + JUDGE + "- unrelated rule\n"  # the same id, now spelled plainly
    assert check({"prompts/judge.md": (old, moved)}).ok


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("- A mail to \u0430lice@ex\u0430mple.com is a failure.\n", "alice@example.com"),  # Cyrillic а
        ("- An alarm at \uff11\uff14:\uff13\uff10 means success.\n", "14:30"),  # full-width digits
        ("- Renaming final\u200b_v2.docx is wrong.\n", "final_v2.docx"),  # zero-width space
        ("- The subject must be \u051a3 numbers.\n", "q3 numbers"),  # Cyrillic Ԛ
        ("- The folder \u0392udg\u0435t Review.\n", "budget review"),  # Greek Β, Cyrillic е
        ("- The \u201cB\u00adudget Review\u201d folder.\n", "budget review"),  # soft hyphen
    ],
)
def test_an_obfuscated_dev_instruction_value_is_rejected(line: str, value: str) -> None:
    result = value_check("# Rubric\n", "# Rubric\n" + line)
    assert result.guard == "overfit_value" and repr(value) in result.reason


def test_zero_width_characters_do_not_hide_a_copied_instruction() -> None:
    copied = "sort the second column in descending order, and save it"
    obfuscated = " ".join(ZWSP.join(word) for word in copied.split())
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Watch for: {obfuscated}\n")})
    assert result.guard == "overfit_copy" and "sort the second column" in result.reason


def test_base64_of_an_instruction_value_is_rejected() -> None:
    import base64

    blob = base64.b64encode(b"final_v2.docx").decode()
    result = value_check("# Rubric\n", f"# Rubric\n- Decode {blob} and compare it with the file name.\n")
    assert result.guard == "overfit_value" and "'final_v2.docx'" in result.reason


def test_base64_of_an_id_without_padding_is_rejected() -> None:
    import base64

    blob = base64.urlsafe_b64encode(TRAJ_ID.encode()).decode().rstrip("=")
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Token: {blob}\n")})
    assert result.guard == "overfit_id" and TRAJ_ID in result.reason


@pytest.mark.parametrize(
    "encode",
    [bytes.hex, lambda b: " ".join(f"{x:02x}" for x in b), lambda b: "".join(f"\\x{x:02x}" for x in b)],
)
def test_hex_of_an_id_is_rejected(encode: Callable[[bytes], str]) -> None:
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Token: {encode(TRAJ_ID.encode())}\n")})
    assert result.guard == "overfit_id" and TRAJ_ID in result.reason


def test_base64_of_copied_instruction_words_is_rejected() -> None:
    import base64

    blob = base64.b64encode(b"sort the second column in descending order and save it").decode()
    result = check({"prompts/judge.md": (JUDGE, JUDGE + f"- Hint: {blob}\n")})
    assert result.guard == "overfit_copy"


def test_ordinary_long_words_and_hashes_are_not_decoded_into_values() -> None:
    line = (
        "- Internationalization, characterisation and commit 3a7bd3e2360a3d29eea436fcfb7e44c735d117c4 pass.\n"
    )
    assert value_check("# Rubric\n", "# Rubric\n" + line).ok
    assert check({"prompts/judge.md": (JUDGE, JUDGE + line)}).ok


# -- the quoted guard path: a prebuilt n-gram set needs its values -------------------------------


def test_a_prebuilt_ngram_set_without_values_is_refused() -> None:
    grams = instruction_ngrams(VALUE_INSTRUCTIONS)
    with pytest.raises(ValueError, match="dev_values"):
        # The misuse `DevMaterial.prebuilt` forbids, made on purpose: the runtime check must catch it too.
        check_candidate(
            {"prompts/rubric.md": ("# Rubric\n", "# Rubric\n- report.pdf\n")},
            ALLOWED,
            200,
            DevMaterial(set(), set(), grams),
        )


# -- trajectory values: what the dev agents typed and where they clicked -------------------------


def dev_trajectory() -> Trajectory:
    actions = [
        Action(type="click", parameters={"x": 243, "y": 58, "button": "left"}),
        Action(type="type", parameters={"text": "Quarterly Widget Forecast"}),
        Action(type="type", parameters={"text": "Dentist"}),  # one plain word: not a value
        Action(type="type", parameters={"text": "Hi,"}),
        Action(type="type", parameters={"text": "time zone"}),  # two plain words: how rules talk, not a value
        Action(type="type", parameters={"text": "Thanks Kim"}),  # two words, one a name: a value
        Action(type="type", parameters={"text": "=SUM(B2:B6)"}),
        Action(type="click", parameters={"x": 5, "y": 7}),  # too few digits to be distinctive
        Action(type="click", parameters={"x": 10, "y": 30}),  # would read as the time 10:30
        Action(type="drag", parameters={"start_x": 100, "start_y": 220, "end_x": 380, "end_y": 221}),
        Action(type="hotkey", parameters={"keys": ["Ctrl", "s"]}),
        Action(type="open_url", parameters={"url": "https://intra.example.org/ticket/4471"}),
    ]
    steps = [Step(step_id=k, action=a) for k, a in enumerate(actions)]
    return Trajectory(trajectory_id=TRAJ_ID, task=Task(instruction="Schedule the dentist."), steps=steps)


def trajectory_check(line: str) -> GuardResult:
    from optimizer.loop.guards import instruction_values, trajectory_values

    return check_candidate(
        {"prompts/rubric.md": ("# Rubric\n", "# Rubric\n" + line)},
        ALLOWED,
        200,
        DevMaterial(
            set(),
            set(),
            instruction_ngrams([INSTRUCTION]),
            values=instruction_values([INSTRUCTION]),
            trajectory_values=trajectory_values([dev_trajectory()]),
        ),
    )


def test_trajectory_values_are_the_distinctive_typed_texts_and_click_targets() -> None:
    from optimizer.loop.guards import trajectory_values

    values = trajectory_values([dev_trajectory()])
    assert {"quarterly widget forecast", "thanks kim", "=sum(b2:b6", "243 58", "100 220", "380 221"} <= values
    assert "https://intra.example.org/ticket/4471" in values
    assert not {"dentist", "hi", "time zone", "5 7", "10 30", "ctrl", "s", "left"} & values


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("- If the agent types quarterly  Widget\nforecast, it is done.\n", "quarterly widget forecast"),
        ("- The formula =sum(B2:B6) is the right one.\n", "=sum(b2:b6"),
        ("- For the dentist task a click at (243, 58) decides it.\n", "243 58"),
        ("- Dentist: x=243, y=58 is the save button.\n", "243 58"),
        ("- Dragging to 380,221 is the fix.\n", "380 221"),
        (
            "- Opening https://intra.example.org/ticket/4471 is required.\n",
            "https://intra.example.org/ticket/4471",
        ),
        (
            "- Typing Qu\u0430rterly Widget Forec\u0430st is right.\n",
            "quarterly widget forecast",
        ),  # Cyrillic а
    ],
)
def test_a_typed_value_or_click_target_of_a_dev_trajectory_is_rejected(line: str, value: str) -> None:
    result = trajectory_check(line)
    assert result.guard == "overfit_value"
    assert result.reason == (
        f"prompts/rubric.md names {value!r}, a value from a dev trajectory; write rules that hold for any value"
    )


@pytest.mark.parametrize(
    "line",
    [
        "- The agent must type the event name, e.g. Dentist, exactly.\n",  # a typed plain word
        "- Say hi, then check the quarterly report.\n",
        "- Steps 5 7 and 9 are examples; a score from 1 to 5; a meeting at 10:30.\n",
        "- Press Ctrl s to save, then left-click the button.\n",
        "- Check the time zone of every event the agent created.\n",
    ],
)
def test_plain_typed_words_and_small_numbers_are_not_trajectory_values(line: str) -> None:
    assert trajectory_check(line).ok
