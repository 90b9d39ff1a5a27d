"""The settings scripts/demo commits in its workspace before it judges anything, kept here so the tests
check the very values the demo uses.

- ``DEMO_CONFIG`` (judgeloop.toml): the demo split, the paired policy, the local judge. Its thread count
  is not pinned: the judge samples (below), so a pinned count would not make two runs agree, and one
  thread would double the demo's time on an idle two-core machine.
- ``DEMO_JUDGE_SETTINGS`` (prompts/judge.toml): a short ``max_tokens``. The verdict's first field,
  ``success``, is sampled before any reasoning is written, so a shorter reasoning changes no verdict's
  odds; it only saves minutes per candidate. The temperature stays llama.cpp's (0.8, a fresh random
  seed per request), so verdicts still vary from run to run: at temperature 0 this 135M judge answered
  ``true`` on all 24 probed items, with and without a stricter rubric rule, a judge no edit can move.
"""

from __future__ import annotations

from pathlib import Path

from tools.configedit import Scalar, set_config, set_judge_settings

DEMO_CONFIG: dict[tuple[str, str], Scalar] = {
    ("workspace", "dev_split"): "demo",
    ("loop", "policy"): "paired",
    ("judge", "provider"): "local",
}
DEMO_JUDGE_SETTINGS: dict[str, Scalar] = {"max_tokens": 160}


def configure_demo_workspace(root: Path) -> None:
    """Commit ``DEMO_CONFIG`` into ``root``'s judgeloop.toml, then ``DEMO_JUDGE_SETTINGS`` into its
    prompts/judge.toml, each file alone in its own commit, as a user's two edits would be."""
    set_config(
        root,
        DEMO_CONFIG,
        message="demo: dev_split demo, policy paired, the local judge (set by scripts/demo)",
    )
    set_judge_settings(
        root,
        DEMO_JUDGE_SETTINGS,
        message="demo: short verdicts for the local judge (set by scripts/demo)",
    )
