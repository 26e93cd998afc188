"""The README is a user guide that stays true: short, no machine paths, every command it shows names a tool,
module or file that exists. docs/ and the checkpoint READMEs carry no machine paths and no words about how
the work was organised.

Text only (no imports of the package, no subprocesses): a few milliseconds.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 350

# absolute paths of a particular machine (a ROS topic such as /joint_states is not one)
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])/(?:work|root|home)/")
# how the work was organised, outside code (a module such as tools/bag/session.py may be named in code)
ORGANISATION = re.compile(r"\bsessions?\b", re.IGNORECASE)
# top-level folders of this repository: a token starting with one of these names a file that must exist
REPO_DIRS = ("benchmarks", "checkpoints", "config", "deploy", "docs", "edgefm_kernels", "edgefm_ros", "launch", "msg",
             "scripts", "tests")
# options whose value is written by the command, so need not exist beforehand
OUTPUT_OPTIONS = {"--out", "--json", "--log", "--plot", "record:"}


def console_scripts() -> set[str]:
    """The console scripts setup.py declares (read as text: setup.py is not imported)."""
    text = (ROOT / "setup.py").read_text()
    return set(re.findall(r"[\"'](edgefm-[a-z0-9-]+)\s*=", text))


def bash_blocks(markdown: str) -> list[str]:
    """The bodies of the ```bash fenced blocks."""
    return re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """Each command of a bash block as words: comments dropped, continuation lines joined, `a && b` split."""
    text = re.sub(r"\\\n", " ", block)
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:  # an unbalanced quote is a broken example
                words = ["<unparsable>", part]
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value prefix
                words = words[1:]
            if words:
                out.append(words)
    return out


def repo_path(word: str) -> str | None:
    """The repository-relative path a word names (the value of key:=path too), or None."""
    value = word.split(":=", 1)[1] if ":=" in word else word
    value = value.split(",")[0]
    head = value.split("/", 1)[0]
    if head in REPO_DIRS and "/" in value and not any(c in value for c in "<>*$[]{}|"):
        return value.rstrip("/")
    return None


def command_problems(markdown: str, scripts: set[str], root: Path = ROOT) -> list[str]:
    """What a bash block names that does not exist."""
    problems = []
    for block in bash_blocks(markdown):
        for words in commands(block):
            if words[0] == "<unparsable>":
                problems.append(f"cannot parse: {words[1]!r}")
                continue
            cmd = words[0]
            if cmd.startswith("edgefm-") and cmd not in scripts:
                problems.append(f"{cmd}: not a console script of setup.py ({sorted(scripts)})")
            if cmd in ("python", "python3") and len(words) > 1:
                if words[1] == "-m" and len(words) > 2:
                    mod = root / words[2].replace(".", "/")
                    if not (mod.with_suffix(".py").is_file() or (mod / "__init__.py").is_file()):
                        problems.append(f"python -m {words[2]}: no such module")
                elif not words[1].startswith("-") and not (root / words[1]).is_file():
                    problems.append(f"python {words[1]}: no such file")
            if cmd == "bash" and len(words) > 1 and not (root / words[1]).is_file():
                problems.append(f"bash {words[1]}: no such file")
            if words[:3] == ["ros2", "launch", "edgefm_ros"] and len(words) > 3:
                if not (root / "launch" / words[3]).is_file():
                    problems.append(f"ros2 launch edgefm_ros {words[3]}: no launch/{words[3]}")
            for prev, word in zip([""] + words, words):
                if prev in OUTPUT_OPTIONS or word.split(":=")[0] + ":" in OUTPUT_OPTIONS:
                    continue
                path = repo_path(word)
                if path and path.startswith("edgefm_ros/msg/"):  # an interface name: msg/<Name>.msg
                    path = f"msg/{path.rsplit('/', 1)[1]}.msg"
                if path and not (root / path).exists():
                    problems.append(f"{' '.join(words[:3])} ...: {path} does not exist")
    return problems


def link_problems(markdown: str, base: Path) -> list[str]:
    """Relative markdown links whose file does not exist."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", markdown):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (base / path).exists():
            problems.append(f"link {target}: no such file")
    return problems


def prose(markdown: str) -> str:
    """The text outside fenced blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def text_problems(markdown: str) -> list[str]:
    """Machine paths anywhere, and words about how the work was organised in the prose."""
    problems = [f"machine path: ...{markdown[max(0, m.start() - 30):m.end() + 30]!r}..."
                for m in MACHINE_PATH.finditer(markdown)]
    problems += [f"'{m.group(0)}' in: ...{m.string[max(0, m.start() - 40):m.end() + 40]!r}..."
                 for m in ORGANISATION.finditer(prose(markdown))]
    return problems


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


def test_readme_has_no_machine_paths_or_organisation_words():
    assert text_problems(README.read_text()) == []


def test_readme_commands_name_what_exists():
    text = README.read_text()
    assert bash_blocks(text), "README.md has no ```bash block"
    assert command_problems(text, console_scripts()) == []


def test_readme_links_exist():
    assert link_problems(README.read_text(), ROOT) == []


DOCS = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "checkpoints").glob("*/README.md"))


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_docs_have_no_machine_paths_or_organisation_words(path):
    text = path.read_text()
    assert text_problems(text) == []
    assert link_problems(text, path.parent) == []


def test_checks_catch_what_they_are_for(tmp_path):
    """Each check reports a planted fault (so a passing run means something)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "demo.sh").write_text("")
    bad = "\n".join([
        "Trained in the sixth session; data in /work/data/x and /root/cache.",
        "```bash",
        "edgefm-nope --help",
        "edgefm-vla plan --checkpoint checkpoints/missing \\",
        "    --mode fast   # comment",
        "python benchmarks/missing.py --help && bash scripts/demo.sh",
        "python -m edgefm_ros.tools.no_such_module",
        "ros2 launch edgefm_ros missing.launch.py checkpoint:=checkpoints/also-missing",
        "ros2 interface show edgefm_ros/msg/NoSuchMsg",
        "edgefm-vla train --dataset data/x --out checkpoints/new-one",
        "```",
        "[a link](docs/missing.md) and a topic `/joint_states` and `tools/bag/session.py`",
    ])
    found = command_problems(bad, {"edgefm-vla"}, root=tmp_path)
    joined = "\n".join(found)
    for expected in ("edgefm-nope", "checkpoints/missing", "benchmarks/missing.py", "no_such_module",
                     "missing.launch.py", "checkpoints/also-missing", "msg/NoSuchMsg.msg"):
        assert expected in joined, f"{expected} not reported in {found}"
    assert "checkpoints/new-one" not in joined  # an output need not exist
    assert "scripts/demo.sh" not in joined  # it exists
    assert len(link_problems(bad, tmp_path)) == 1
    text = text_problems(bad)
    assert sum(p.startswith("machine path") for p in text) == 2, text
    assert sum(p.startswith("'session'") for p in text) == 1, text
    assert len(bad.splitlines()) <= MAX_README_LINES  # and the length rule is a plain count
