"""A small Dockerfile reader for the static image tests (no Docker engine here)."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Instruction:
    keyword: str
    text: str

    def flags(self) -> tuple[dict[str, str], str]:
        """``--name=value`` flags at the start and the rest of the text."""
        flags, rest = {}, self.text
        while m := re.match(r"\s*--([a-z-]+)=(\S+)\s*", rest):
            flags[m.group(1)] = m.group(2)
            rest = rest[m.end():]
        return flags, rest


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    out, buf = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        buf += " " + stripped.rstrip("\\").strip() if buf else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            keyword, _, text = buf.partition(" ")
            out.append(Instruction(keyword.upper(), text.strip()))
            buf = ""
    return out


def stages(path: Path = DOCKERFILE) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages in order (ARGs substituted in FROM)."""
    args, result = {}, []
    for ins in instructions(path):
        if ins.keyword == "ARG" and not result:
            name, _, default = ins.text.partition("=")
            args[name] = default
        elif ins.keyword == "FROM":
            words = ins.text.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(result))
            result.append(Stage(name, base))
        else:
            result[-1].instructions.append(ins)
    return args, result


def lineage(all_stages: list[Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM (not the ones it only copies from)."""
    by_name = {s.name: s for s in all_stages}
    chain, stage = [], by_name[name]
    while True:
        chain.append(stage)
        if stage.base not in by_name:
            return chain
        stage = by_name[stage.base]


def stage_env(all_stages: list[Stage], name: str) -> dict[str, str]:
    """The environment a stage's containers start with: its ENVs and those of the stages it is built FROM."""
    env: dict[str, str] = {}
    for stage in reversed(lineage(all_stages, name)):
        for ins in stage.all("ENV"):
            env.update(word.split("=", 1) for word in shlex.split(ins.text))
    return env


def dockerignore_excludes(rel_path: str, path: Path = DOCKERIGNORE) -> bool:
    """Whether .dockerignore keeps ``rel_path`` out of the build context (last match wins)."""
    excluded = False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        candidates = [rel_path] + [str(Path(*Path(rel_path).parts[:i])) for i in range(1, len(Path(rel_path).parts))]
        if any(fnmatch.fnmatch(c, pattern) or fnmatch.fnmatch(c, pattern.replace("**/", "")) for c in candidates):
            excluded = not negate
    return excluded


def exec_form(ins: Instruction) -> list[str]:
    import json

    return json.loads(ins.text)


def shell_words(text: str) -> list[str]:
    return shlex.split(text)
