"""images/requirements.txt pins what the tests run against: every package datagen-operator needs at run time,
at the version installed in this venv (images/pin.py regenerates the file when this fails)."""

from __future__ import annotations

from pathlib import Path

from images.pin import canonical, runtime_closure

REQUIREMENTS = Path(__file__).resolve().parents[3] / "images" / "requirements.txt"


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[canonical(name)] = version.strip()
    return found


def test_the_image_pins_are_the_versions_installed_here() -> None:
    installed = runtime_closure()
    pinned = pins()
    differ = {name: (pinned.get(name), installed.get(name)) for name in pinned.keys() | installed.keys()
              if pinned.get(name) != installed.get(name)}  # fmt: skip
    assert not differ, (
        f"images/requirements.txt (pinned, installed here): {differ}; "
        "regenerate it with `.venv/bin/python images/pin.py > images/requirements.txt`"
    )
