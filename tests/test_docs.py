"""The documentation cannot drift: the configuration reference is generated and checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_recovery import reference
from celery_recovery.core.setting_parsers import count
from celery_recovery.core.settings import SETTINGS, SettingSpec

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_every_setting_and_its_parser_are_documented():
    assert reference.problems() == []


def test_generated_docs_match_the_settings():
    stale = reference.stale_files(DOCS)
    assert not stale, (
        f"{', '.join(p.name for p in stale)} differ from what celery_recovery/core/settings.py and "
        f"the presets give; regenerate with `{reference.REGENERATE}` and commit the result"
    )


def test_a_setting_added_without_docs_fails(monkeypatch):
    # Given a new setting whose doc is empty and whose parser has no docstring
    def _undocumented(key, value):
        return value

    new = (
        SettingSpec("new_thing", 1, count, ""),
        SettingSpec("other_thing", 1, _undocumented, "A documented setting, parsed oddly."),
    )
    monkeypatch.setattr(reference, "SETTINGS", SETTINGS + new)
    # Then the reference reports both, and the checked-in reference is out of date
    found = "\n".join(reference.problems())
    assert "'recovery_new_thing' needs a doc" in found
    assert "_undocumented of 'recovery_other_thing' needs a docstring" in found
    assert DOCS / reference.CONFIGURATION in reference.stale_files(DOCS)
    assert reference.main(["--check", "--docs-dir", str(DOCS)]) == 1


def test_every_setting_appears_with_its_names_and_default():
    text = (DOCS / reference.CONFIGURATION).read_text(encoding="utf-8")
    for spec in SETTINGS:
        assert f"### `{spec.conf_key}`" in text
        assert f"`{spec.env_var}`" in text


def test_check_mode_passes_on_the_checked_in_docs(capsys):
    assert reference.main(["--check", "--docs-dir", str(DOCS)]) == 0
    assert capsys.readouterr().err == ""


def test_tuning_without_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        reference.render_tuning("# Tuning\n")


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.name)
def test_python_examples_compile(path):
    text = path.read_text(encoding="utf-8")
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        compile(block, f"{path.name} example {number + 1}", "exec")
