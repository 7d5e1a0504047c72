"""What the repository's files cite, a clone of it can open.

Comments, docstrings and docs name their sources: a file of this repository, a file of SGLang's released
wheel ("SGLang 0.5.23 sglang/srt/..."), a published model file or a web page. None may name a file that
sits outside the repository (the notes and reference files it was first built from are not part of it),
and every relative Markdown link must land on a tracked file.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

from tests.harness.testbin import REPO_ROOT

SCOPE = ("operator", "docs", "charts", "examples", "tests", "README.md")

# Spelled in pieces so this file does not name them itself.
OUTSIDE = ("../" + "shared", "shared" + "/reference", "field" + " notes")
_MD_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A Markdown file named in prose or a comment; one inside a longer name (`qwen3:4b.md`, a URL) is not matched.
_MD_NAME = re.compile(r"(?<![\w:/.-])((?:\.{1,2}/)*[\w-]+(?:/[\w.-]+)*\.md)\b")


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *SCOPE], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return tuple(name for name in out.split("\0") if name and (REPO_ROOT / name).is_file())


def text_of(name: str) -> str | None:
    data = (REPO_ROOT / name).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def resolves_inside(base: PurePosixPath, target: str) -> bool:
    """`target`, relative to the folder `base` (repo-relative), is a tracked file or folder of the repository."""
    path = (REPO_ROOT / base / target).resolve()
    try:
        path.relative_to(REPO_ROOT.resolve())
    except ValueError:
        return False
    return path.exists()


def outside_references(name: str, text: str) -> list[str]:
    """Each place in the file `name` that points outside the repository, as `name:line: what`."""
    base = PurePosixPath(name).parent
    basenames = {PurePosixPath(each).name for each in tracked()}
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"{name}:{number}: names {phrase!r}" for phrase in OUTSIDE if phrase in line.lower()]
        if name.endswith(".md"):
            for target in _MD_LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:|#", target):
                    continue  # a URL or an anchor of this page
                if not resolves_inside(base, target.split("#", 1)[0]):
                    found.append(f"{name}:{number}: link {target!r} does not resolve inside the repository")
        for mention in _MD_NAME.findall(line):
            if resolves_inside(base, mention) or resolves_inside(PurePosixPath(), mention):
                continue
            if "/" not in mention and mention in basenames:
                continue  # `checks.md` in prose, named by its file name
            found.append(f"{name}:{number}: names {mention!r}, which is not a file of the repository")
    return found


def test_no_tracked_file_points_outside_the_repository() -> None:
    assert len(tracked()) > 100  # the listing worked
    this = Path(__file__).resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    found = [
        hit
        for name in tracked()
        if name != this and (text := text_of(name)) is not None
        for hit in outside_references(name, text)
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_each_kind_of_outside_reference() -> None:
    assert outside_references("docs/x.md", "see ../" + "shared/x.md") != []
    assert outside_references("docs/x.md", "[notes](../../elsewhere/notes.md)") != []
    assert outside_references("docs/x.md", "[guide](missing.md)") != []
    assert outside_references("operator/x.py", "# held to " + "kimi-k2-format.md") != []
    assert outside_references("operator/x.py", "# (field" + " notes 3)") != []
    assert outside_references("docs/x.md", "[checks](checks.md), [up](../README.md), [web](https://x.org/a.md)") == []
    assert outside_references("operator/x.py", "# docs/sglang-fidelity.md, model_cards/qwen3:4b.md") == []


def test_every_preset_source_is_defined_in_the_header() -> None:
    """Each key a preset's `sources:` lists is defined in presets.yaml's header, and each defined key is used."""
    from datagen_operator.presets import presets

    text = (REPO_ROOT / "operator/datagen_operator/presets/presets.yaml").read_text()
    defined = set(re.findall(r"^#\s+\[([\w.-]+)\]", text, re.M))
    used = {key for preset in presets().values() for key in preset.sources}
    assert used <= defined, sorted(used - defined)
    cited = set(re.findall(r"\[([\w.-]+)\]", text))
    assert defined <= used | cited, sorted(defined - used - cited)
