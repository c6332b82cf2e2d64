"""Every `headwater ...` command the docs show names a real command, with options it has.

The fenced ``console`` blocks (lines after ``$ ``) and ``bash``/``sh``/``shell`` blocks of every page
of docs/ and of README.md are split into commands; each call of ``headwater`` is walked down the
click group ``headwater.cli.main:main``: every word before the arguments must be a sub-command of
the group it follows, and every option must be one of the command it is given to. A renamed
command or option fails here, not in a reader's terminal.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from headwater.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^[ \t]*```(\w*)([^\n]*)\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)
SHELLS = {"bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
HELP = {"-h", "--help"}


@dataclass(frozen=True)
class Call:
    """One ``headwater`` call of a page: its words after ``headwater`` and where it is."""

    where: str
    words: tuple[str, ...]


def shell_lines(lang: str, body: str) -> list[str]:
    """The command lines of a fenced block (console: only ``$`` lines), continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in body.splitlines():
        line = raw.strip()
        if lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def calls_in(path: Path) -> list[Call]:
    text = path.read_text(encoding="utf-8")
    found: list[Call] = []
    for match in FENCE.finditer(text):
        lang, _info, body = match.groups()
        if lang not in SHELLS:
            continue
        line_no = text.count("\n", 0, match.start()) + 1
        for line in shell_lines(lang, body):
            try:
                words = shlex.split(line, comments=True)
            except ValueError as exc:
                pytest.fail(f"{path.relative_to(ROOT)}:{line_no}: cannot split {line!r} ({exc})")
            segment: list[str] = []
            for word in [*words, ";"]:
                if word not in SEPARATORS:
                    segment.append(word)
                    continue
                while segment and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", segment[0]):
                    segment.pop(0)  # FOO=bar headwater ...
                if segment and Path(segment[0]).name == "headwater":
                    found.append(Call(f"{path.relative_to(ROOT)}:{line_no}", tuple(segment[1:])))
                segment = []
    return found


def _option(command: click.Command, name: str) -> click.Parameter | None:
    for param in command.params:
        if isinstance(param, click.Option) and name in (*param.opts, *param.secondary_opts):
            return param
    return None


def problems(words: tuple[str, ...]) -> list[str]:
    """What is wrong with ``headwater WORDS`` against the click group (empty: nothing)."""
    command: click.Command = main
    path = ["headwater"]
    found: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            break
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            option = _option(command, name)
            if option is None and name not in HELP:
                found.append(f"`{' '.join(path)}` has no option {name}")
            elif (
                isinstance(option, click.Option) and not (option.is_flag or option.count) and "=" not in word
            ):
                i += option.nargs  # the option's value(s)
            i += 1
            continue
        if isinstance(command, click.Group):
            sub = command.commands.get(word)
            if sub is None:
                known = ", ".join(sorted(command.commands))
                found.append(f"`{' '.join(path)}` has no command {word!r} (it has: {known})")
                break
            command, path = sub, [*path, word]
        i += 1  # an argument of the command
    return found


ALL_CALLS = [call for page in PAGES for call in calls_in(page)]


def test_the_docs_show_headwater_commands() -> None:
    assert len(ALL_CALLS) >= 40, [c.where for c in ALL_CALLS]
    assert any(c.where.startswith("docs/tutorials/your-event-stream.md") for c in ALL_CALLS)
    assert any(c.where.startswith("README.md") for c in ALL_CALLS)


@pytest.mark.parametrize("call", ALL_CALLS, ids=lambda c: f"{c.where} {' '.join(c.words[:3])}")
def test_every_command_in_the_docs_is_a_real_one(call: Call) -> None:
    assert problems(call.words) == [], f"{call.where}: headwater {' '.join(call.words)}"


def test_the_checker_catches_renamed_commands_and_options() -> None:
    assert problems(("run", "nearline", "--source", "orders", "--idle-exit", "10")) == []
    assert problems(("--repo", "shop", "features", "describe", "some_view")) == []
    renamed = problems(("run", "nearlin"))
    assert len(renamed) == 1
    assert "no command 'nearlin'" in renamed[0]
    assert problems(("online", "get", "v", "--namespace", "x")) == [
        "`headwater online get` has no option --namespace"
    ]
    assert problems(("check", "--format=json")) == []
    assert problems(("serve", "--no-admission", "--port", "8080")) == []
