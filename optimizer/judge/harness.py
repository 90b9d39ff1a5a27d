"""Harness judges: a coding-agent CLI (Codex, Claude Code, Gemini CLI, OpenCode, or any command) run
once per item in a fresh sandbox folder, as the official AgentHorizon runner runs its agentic judges.

The sandbox of one item holds, under the names the official prompt uses:

- ``agenthorizon_md/<id>.md``: the trajectory's Markdown, rendered by `optimizer.devset.markdown`
  (the byte-identical renderer) with every local screenshot link rewritten to the item's own folder;
- ``agenthorizon_json/<id>.json``: the blind projection (``trajectory_id``, ``task``,
  ``environment``, ``steps``; no extra fields, the same links);
- ``data/media/images/<id>/step_<k+1>.png``: the screenshots. The release files them under the
  *recording* id, which for a negative is its paired positive's trajectory id; the sandbox files
  them under the item's own id (the official prompt's ``<deliverable_id>``), so nothing in it names
  another item;
- ``AGENTS.md``, ``CLAUDE.md``, ``GEMINI.md``: the judge instructions (``prompts/judge.md`` with
  ``rubric.md``: what the optimiser edits), one file per CLI's convention, the same text in each.

Nothing else: no label, no other item, no path of the workspace. The per-item prompt is
`HARNESS_PROMPT` with ``{{TRAJECTORY_ID}}`` filled (fixed, like the official runner's prompt file):
it points the CLI at those files and asks for the verdict as ``./<id>.json`` and as its final message.
The verdict is read from ``<id>.json`` when the CLI wrote it, else from the CLI's final message.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.devset.markdown import render_markdown
from optimizer.devset.split import Split, canonical_screenshot_link
from optimizer.errors import UserError
from optimizer.judge.prompts import PromptSet
from optimizer.judge.sandbox import allowed_env, require_bwrap
from optimizer.judge.types import JudgeRequest, Sandbox, SandboxFile, TextPart, stable_json
from optimizer.models import Trajectory
from optimizer.workspace.config import JudgeSection

TRAJECTORY_ID = "{{TRAJECTORY_ID}}"
# In a `command`, this element is replaced by the prompt; without it the prompt goes to stdin.
PROMPT_ARG = "{{PROMPT}}"
INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md", "GEMINI.md")
MARKDOWN_DIR = "agenthorizon_md"
JSON_DIR = "agenthorizon_json"
IMAGES_DIR = "data/media/images"
# A verdict file larger than this is not read (a verdict is a few hundred bytes).
MAX_VERDICT_BYTES = 1_000_000

HARNESS_PROMPT = """\
Judge one computer-use trajectory. Your instructions (how to judge, the mistake types, the answer
format) are in AGENTS.md / CLAUDE.md / GEMINI.md in your working directory: read them first.

Trajectory ID: `{{TRAJECTORY_ID}}`

The trajectory is on disk, not in this message: read `./agenthorizon_md/{{TRAJECTORY_ID}}.md` (the goal
and every step). `./agenthorizon_json/{{TRAJECTORY_ID}}.json` holds the same trajectory as JSON. Each
step's screenshot (the screen before its action) is the local file
`./data/media/images/{{TRAJECTORY_ID}}/step_<N>.png` that the Markdown links; open the ones you need,
at least one. Do not fetch anything from the network.

Answer with one JSON object and nothing else, as your instructions specify
(`success`, `reasoning`, `confidence`, `mistake_type`). Write it to `./{{TRAJECTORY_ID}}.json` if you can
write files, and give the same object as your final message.
"""

BUDGET_REFUSAL = (
    "a budget needs the most one {name} judge call may cost, which the CLI cannot tell before "
    "the call: set [judge] price_per_call_usd (or drop --budget-usd)"
)


def check_budget(judge: JudgeSection, budget_usd: float | None) -> None:
    """Refuse a budgeted run of a harness judge without ``price_per_call_usd`` before anything starts
    (the evaluator refuses it too, via the provider's traits; this is the same check without a provider)."""
    if budget_usd is not None and judge.provider == "command" and judge.price_per_call_usd is None:
        raise UserError(BUDGET_REFUSAL.format(name="command"))


@dataclass(frozen=True)
class HarnessSpec:
    """How one CLI is run: its argv (``{{PROMPT}}`` marks the prompt; absent: the prompt goes to
    stdin), how its stdout is read (``output``), the variables it needs passed on (``keys``, besides
    ``[judge] pass_env``), those set or removed for it, and its own config files and folders (relative
    to the home folder) that a confined run shows it read-only (``config_paths``)."""

    name: str
    argv: tuple[str, ...]
    output: str  # claude-json | gemini-json | codex-jsonl | opencode-jsonl | text
    keys: tuple[str, ...] = ()
    set_env: tuple[tuple[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()
    config_paths: tuple[str, ...] = ()

    @property
    def prompt_on_stdin(self) -> bool:
        return PROMPT_ARG not in self.argv

    @property
    def reports_cost(self) -> bool:
        """Whether the CLI's output says what a call cost (`parse_output`)."""
        return self.output in ("claude-json", "opencode-jsonl")

    def identity(self, confinement: str = "bwrap") -> str:
        """What the cache keys a harness by: the whole command line, its environment rules and how it
        was confined (a confined and an unconfined verdict are not the same judge's)."""
        return stable_json(
            {
                "name": self.name,
                "argv": list(self.argv),
                "output": self.output,
                "set_env": [list(p) for p in self.set_env],
                "confinement": confinement,
            }
        )


def _model_flag(flag: str, model: str) -> tuple[str, ...]:
    return (flag, model) if model else ()


def preset(name: str, model: str) -> HarnessSpec:
    """The non-interactive JSON invocation of a known CLI (the official runner's, per CLI)."""
    if name == "codex":
        # `exec --json` prints JSONL events; the sandbox is not a git repository.
        return HarnessSpec(
            name,
            ("codex", "exec", "--json", "--skip-git-repo-check", *_model_flag("-m", model), PROMPT_ARG),
            "codex-jsonl",
            keys=("OPENAI_API_KEY", "CODEX_API_KEY"),
            config_paths=(".codex",),
        )
    if name == "claude":
        # Permissions skipped as the official runner does: a fresh project folder has no trusted paths,
        # and Claude Code then refuses to Read the screenshots. The folder is a throwaway sandbox.
        return HarnessSpec(
            name,
            (
                "claude",
                "-p",
                "--dangerously-skip-permissions",
                PROMPT_ARG,
                *_model_flag("--model", model),
                "--output-format",
                "json",
            ),
            "claude-json",
            keys=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
            unset_env=("CLAUDECODE",),
            config_paths=(".claude", ".claude.json"),
        )
    if name == "gemini":
        # Gemini CLI appends -p after stdin: the prompt goes to stdin, -p only makes it non-interactive.
        return HarnessSpec(
            name,
            (
                "gemini",
                "-p",
                "Follow the instructions given on standard input.",
                *_model_flag("--model", model),
                "--output-format",
                "json",
                "--approval-mode",
                "yolo",
            ),
            "gemini-json",
            keys=("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS"),
            set_env=(("GEMINI_CLI_TRUST_WORKSPACE", "true"),),
            unset_env=("GEMINI_CLI",),
            config_paths=(".gemini",),
        )
    if name == "opencode":
        return HarnessSpec(
            name,
            ("opencode", "run", "--format", "json", *_model_flag("-m", model), PROMPT_ARG),
            "opencode-jsonl",
            config_paths=(".config/opencode", ".local/share/opencode"),
        )
    raise ValueError(f"unknown harness {name!r}")  # config validation makes this unreachable


def harness_spec(judge: JudgeSection) -> HarnessSpec:
    """The CLI ``[judge]`` names: ``command`` as given (read as its preset's output when ``harness`` is
    set or the program is a known CLI, else stdout as plain text), or the ``harness`` preset."""
    if not judge.command:
        assert judge.harness is not None  # JudgeSection validation
        return preset(judge.harness, judge.model)
    program = Path(judge.command[0]).name
    base_name = judge.harness or (program if program in ("codex", "claude", "gemini", "opencode") else None)
    base = preset(base_name, judge.model) if base_name else None
    return HarnessSpec(
        name=base_name or program,
        argv=tuple(judge.command),
        output=base.output if base else "text",
        keys=base.keys if base else (),
        set_env=base.set_env if base else (),
        unset_env=base.unset_env if base else (),
        config_paths=base.config_paths if base else (),
    )


def child_env(
    spec: HarnessSpec, pass_env: list[str], cwd: str, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The CLI's environment, from an allow-list (`optimizer.judge.sandbox.allowed_env`): PATH, HOME,
    LANG, LC_*, TERM, the harness's own keys and ``pass_env``, then its ``set_env``, and ``PWD`` its
    working directory ``cwd``. No other variable: no other provider's key, no path of the workspace."""
    source = dict(os.environ if environ is None else environ)
    env = allowed_env(source, [*spec.keys, *pass_env], spec.set_env)
    for name in spec.unset_env:
        env.pop(name, None)
    env["PWD"] = cwd
    return env


def command_line(spec: HarnessSpec, prompt: str, trajectory_id: str) -> tuple[list[str], bytes | None]:
    """The argv to run and the stdin to send (None: no stdin)."""
    argv = [prompt if a == PROMPT_ARG else a.replace(TRAJECTORY_ID, trajectory_id) for a in spec.argv]
    return argv, (prompt.encode() if spec.prompt_on_stdin else None)


def check_confinement(judge: JudgeSection) -> None:
    """Refuse a harness judge that should run confined where bubblewrap cannot (`UserError`, one line
    naming what to install), before anything starts; the provider checks the same when it is made."""
    if judge.provider == "command" and judge.sandbox == "bwrap":
        require_bwrap()


# -- the sandbox ---------------------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _blind_json(traj: Trajectory) -> dict[str, Any]:
    """The release's blind projection of ``traj`` (declared fields only: extras never reach the judge)."""
    task = traj.task
    out: dict[str, Any] = {
        "trajectory_id": traj.trajectory_id,
        "task": {
            "instruction": task.instruction,
            "category": task.category,
            "subcategory": task.subcategory,
            "task_type": task.task_type,
            "applications": list(task.applications),
        },
    }
    if traj.environment is not None:
        out["environment"] = {
            "os": traj.environment.os,
            "screen_resolution": traj.environment.screen_resolution,
        }
    out["steps"] = [
        {
            "step_id": s.step_id,
            "screenshot": s.screenshot,
            "action": {"type": s.action.type, "parameters": s.action.parameters},
            "thought": s.thought,
            "action_description": s.action_description,
            "timestamp_us": s.timestamp_us,
        }
        for s in traj.steps
    ]
    return out


def sandbox_request(traj: Trajectory, split: Split, prompts: PromptSet, runner: str) -> JudgeRequest:
    """The request of a harness judge for one item: the instructions as ``system`` (they become the
    instruction files), the filled prompt as the one text part, the sandbox's files. ``runner`` is the
    harness's identity (`HarnessSpec.identity`): the request's fingerprint, hence the cache, keys it."""
    tid = traj.trajectory_id
    files: list[SandboxFile] = []
    steps = []
    for step in traj.steps:
        source = split.screenshot_file(step)
        if source is not None and source.is_file():
            link = canonical_screenshot_link(tid, step.step_id)
            data = source.read_bytes()
            files.append(SandboxFile(path=link.removeprefix("./"), digest=_digest(data), source=str(source)))
            step = step.model_copy(update={"screenshot": link})
        elif source is not None:
            step = step.model_copy(update={"screenshot": None})  # a missing file: no dangling link
        steps.append(step)
    shown = traj.model_copy(update={"steps": steps})
    markdown = render_markdown(shown).encode()
    blind = (json.dumps(_blind_json(shown), indent=2, ensure_ascii=False) + "\n").encode()
    instructions = prompts.instructions()
    text_files = [(f"{MARKDOWN_DIR}/{tid}.md", markdown), (f"{JSON_DIR}/{tid}.json", blind)]
    text_files += [(name, instructions.encode()) for name in INSTRUCTION_FILES]
    files = [SandboxFile(path=p, digest=_digest(d), data=d) for p, d in text_files] + files
    prompt = HARNESS_PROMPT.replace(TRAJECTORY_ID, tid)
    return JudgeRequest(
        system=instructions,
        parts=(TextPart(prompt),),
        sandbox=Sandbox(trajectory_id=tid, runner=runner, files=tuple(files)),
    )


def write_sandbox(sandbox: Sandbox, folder: Path) -> None:
    """Lay ``sandbox``'s files out in the empty ``folder`` (paths are the renderer's own, never a
    stored value: each is checked to stay inside the folder all the same)."""
    root = folder.resolve()
    for f in sandbox.files:
        target = (root / f.path).resolve()
        if root not in target.parents:
            raise ValueError(f"sandbox file {f.path!r} leads outside the sandbox")
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.data is not None:
            target.write_bytes(f.data)
        else:
            assert f.source is not None
            target.write_bytes(Path(f.source).read_bytes())


def verdict_file_text(folder: Path, trajectory_id: str) -> str | None:
    """The text of ``<id>.json`` the CLI wrote in its sandbox, or None (absent, not a plain file). A file
    over `MAX_VERDICT_BYTES` is not read: its text is a note saying so, which fails to parse as a verdict
    (an oversized verdict is a wrong answer, never silently replaced by the CLI's final message)."""
    path = folder / f"{trajectory_id}.json"
    try:
        if path.is_symlink() or not path.is_file():
            return None
        size = path.stat().st_size
        if size > MAX_VERDICT_BYTES:
            return f"(verdict file {trajectory_id}.json of {size} bytes, over the {MAX_VERDICT_BYTES}-byte cap: not read)"
        with path.open("rb") as f:  # (read no more than the cap, should it grow meanwhile)
            return f.read(MAX_VERDICT_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


# -- reading the CLI's output --------------------------------------------------------------------


@dataclass(frozen=True)
class CliOutput:
    """What a CLI's stdout says: its final message, tokens as `ProviderReply` counts them, the cost it
    reported (None: not reported) and the model that answered (None: not said)."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    model: str | None = None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0


def _jsonl(stdout: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _object(stdout: str) -> dict[str, Any] | None:
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def parse_output(output: str, stdout: str) -> CliOutput:
    """Read a CLI's stdout in its ``output`` format. Never raises: what cannot be read is left out
    (an unreadable stdout gives an empty final message, which then fails to parse as a verdict)."""
    if output == "claude-json":
        # One JSON object: `result` the final message, `total_cost_usd`, `usage` in Anthropic's convention.
        obj = _object(stdout) or {}
        usage = _dict(obj.get("usage"))
        reported = obj.get("total_cost_usd")
        models = obj.get("modelUsage")
        return CliOutput(
            text=str(obj.get("result") or ""),
            input_tokens=_int(usage.get("input_tokens")),
            output_tokens=_int(usage.get("output_tokens")),
            cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
            cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
            cost_usd=float(reported)
            if isinstance(reported, int | float) and not isinstance(reported, bool)
            else None,
            model=next(iter(models), None) if isinstance(models, dict) else None,
        )
    if output == "gemini-json":
        # One JSON object: `response`, and per-model token counts under stats.models (no cost).
        obj = _object(stdout) or {}
        stats = _dict(obj.get("stats"))
        models = _dict(stats.get("models"))
        prompt_tokens = out_tokens = cached = 0
        for m in models.values():
            if not isinstance(m, dict):
                continue
            tokens = _dict(m.get("tokens"))
            prompt_tokens += _int(
                tokens.get("prompt") or m.get("promptTokenCount") or m.get("totalPromptTokens")
            )
            out_tokens += _int(
                tokens.get("candidates") or m.get("candidatesTokenCount") or m.get("totalCandidatesTokens")
            )
            cached += _int(tokens.get("cached"))
        return CliOutput(
            text=str(obj.get("response") or ""),
            input_tokens=max(0, prompt_tokens - cached),
            output_tokens=out_tokens,
            cache_read_tokens=cached,
            model=next(iter(models), None),
        )
    if output == "codex-jsonl":
        # JSONL: the last `item.completed` agent_message is the answer; each `turn.completed` has usage
        # in OpenAI's convention (input_tokens include cached_input_tokens). No cost.
        text, inp, cached, out = "", 0, 0, 0
        for ev in _jsonl(stdout):
            item = _dict(ev.get("item"))
            if ev.get("type") == "item.completed" and item.get("type") == "agent_message":
                text = str(item.get("text") or "")
            u = _dict(ev.get("usage"))
            if ev.get("type") == "turn.completed" and u:
                inp, cached, out = (
                    inp + _int(u.get("input_tokens")),
                    cached + _int(u.get("cached_input_tokens")),
                    out + _int(u.get("output_tokens")),
                )
        return CliOutput(
            text=text, input_tokens=max(0, inp - cached), cache_read_tokens=cached, output_tokens=out
        )
    if output == "opencode-jsonl":
        # JSONL: `text` parts (the last is the answer); each `step_finish` part has its cost and tokens.
        text, inp, out, read, write = "", 0, 0, 0, 0
        cost: float | None = None
        for ev in _jsonl(stdout):
            part = _dict(ev.get("part"))
            if ev.get("type") == "text":
                text = str(part.get("text") or "")
            elif ev.get("type") == "step_finish":
                if isinstance(part.get("cost"), int | float):
                    cost = (cost or 0.0) + float(part["cost"])
                tokens = _dict(part.get("tokens"))
                cache = _dict(tokens.get("cache"))
                inp, out = inp + _int(tokens.get("input")), out + _int(tokens.get("output"))
                read, write = read + _int(cache.get("read")), write + _int(cache.get("write"))
        return CliOutput(
            text=text,
            input_tokens=inp,
            output_tokens=out,
            cache_read_tokens=read,
            cache_write_tokens=write,
            cost_usd=cost,
        )
    return CliOutput(text=stdout)
