"""The configuration reference, generated from the settings' own definitions.

``docs/configuration.md`` and the presets table in ``docs/tuning.md`` are
rendered from :data:`celery_recovery.core.settings.SETTINGS` (name, default, doc,
unit, parser) and :data:`celery_recovery.beat_schedules.PRESETS`, so they
cannot drift from the code; ``tests/test_docs.py`` fails when they do.  Each
parser's docstring reads ``"<type>: <allowed values>"`` and supplies those two
columns.  Regenerate after changing a setting::

    python -m celery_recovery.reference            # rewrite the generated docs
    python -m celery_recovery.reference --check    # exit 1 if they are out of date
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from celery_recovery.core.app_conf import PREFIX
from celery_recovery.core.presets import DEFAULT_PRESET, PRESETS
from celery_recovery.core.settings import ENV_PREFIX, SETTINGS, SettingSpec
from celery_recovery.core.timing_relations import MIN_HEARTBEATS_PER_THRESHOLD
from celery_recovery.core.urls import SUPPORTED_SCHEMES
from celery_recovery.sweeps.fallback import MISSED_SWEEPS

REGENERATE = "python -m celery_recovery.reference"
DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
CONFIGURATION = "configuration.md"
TUNING = "tuning.md"
BEGIN = "<!-- BEGIN GENERATED: presets (python -m celery_recovery.reference) -->"
END = "<!-- END GENERATED: presets -->"
#: A doc shorter than this says too little to be a reference entry.
MIN_DOC_LENGTH = 40


def parser_description(parse: Callable[..., Any]) -> tuple[str, str] | None:
    """(type, allowed values) from a parser's docstring ``"<type>: <allowed values>"``."""
    text = " ".join((inspect.getdoc(parse) or "").split())
    kind, sep, allowed = text.partition(": ")
    if not sep or not kind or not allowed:
        return None
    return kind, _markdown(allowed)


def problems() -> list[str]:
    """What keeps the reference from being complete: settings or parsers without docs."""
    found = []
    for spec in SETTINGS:
        doc = spec.doc.strip()
        if len(doc) < MIN_DOC_LENGTH or not doc.endswith("."):
            found.append(
                f"setting {spec.conf_key!r} needs a doc (one or more sentences, ending with a "
                f"period, at least {MIN_DOC_LENGTH} characters) in celery_recovery/core/settings.py"
            )
        if parser_description(spec.parse) is None:
            found.append(
                f"the parser {spec.parse.__name__} of {spec.conf_key!r} needs a docstring "
                "'<type>: <allowed values>' in celery_recovery/core/settings.py"
            )
    names = {spec.name for spec in SETTINGS}
    for preset, values in PRESETS.items():
        for name in set(values) - names:
            found.append(f"preset {preset!r} sets {name!r}, which is not a setting")
    return found


def render_configuration() -> str:
    """The whole text of ``docs/configuration.md``."""
    timing = list(PRESETS[DEFAULT_PRESET])
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from celery_recovery/core/settings.py by `{REGENERATE}`; do not edit. -->",
        "",
        "Every setting can be given in three places; a later one wins:",
        "",
        f"1. `app.conf` (or `config_from_object`): `{PREFIX}<name>`, e.g. "
        f"`app.conf.{PREFIX}zombie_threshold = 60`. An app configured with "
        '`config_from_object(settings, namespace="CELERY")` (every Django project) reads '
        f"them as Celery reads its own: `CELERY_{PREFIX.upper()}<NAME>`, e.g. "
        f"`CELERY_{PREFIX.upper()}DATABASE_URL`. A key that looks like one of ours but is not "
        "read under the app's namespace is warned about at start, and refused when it is the "
        "database URL and names another store than the one that would be used.",
        f"2. The environment of the process: `{ENV_PREFIX}<NAME>`, e.g. "
        f"`{ENV_PREFIX}ZOMBIE_THRESHOLD=60`.",
        "3. Keyword arguments: `Recovery(app, zombie_threshold=60)` (with or without the "
        f"`{PREFIX}` prefix).",
        "",
        "Settings are read once, when `Recovery(app)` is called: configure the app first. "
        f"A timing preset (`{PREFIX}preset`) supplies the defaults of the timing settings; "
        "a setting given in any of the three places overrides its preset value. "
        "Durations are seconds: a number or a `datetime.timedelta` (in the environment, "
        "a number).",
        "",
        "## Summary",
        "",
        "| `app.conf` name | environment variable | type | default |"
        + "".join(f" `{p}` |" for p in PRESETS if p != DEFAULT_PRESET),
        "| --- | --- | --- | --- |" + " --- |" * (len(PRESETS) - 1),
    ]
    for spec in SETTINGS:
        others = "".join(
            f" {_value(spec, PRESETS[p][spec.name])} |" if spec.name in timing else " |"
            for p in PRESETS
            if p != DEFAULT_PRESET
        )
        lines.append(
            f"| `{spec.conf_key}` | `{spec.env_var}` | {_type(spec)} | "
            f"{_value(spec, spec.default)} |{others}"
        )
    lines += ["", "## Settings", ""]
    for spec in SETTINGS:
        lines += _section(spec, timing)
    lines += _validation()
    return "\n".join(lines).rstrip() + "\n"


def render_presets_table() -> str:
    """The presets table of ``docs/tuning.md``, with the timings that follow from each."""
    names = list(PRESETS)
    lines = [
        "| | " + " | ".join(f"`{p}`" for p in names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for name in PRESETS[DEFAULT_PRESET]:
        key = f"`{PREFIX}{name}`"
        lines.append(f"| {key} | " + " | ".join(_s(PRESETS[p][name]) for p in names) + " |")
    derived = (
        (
            "worker killed → zombie found (`zombie_threshold - heartbeat_interval` to "
            "`zombie_threshold + sweep_interval`)",
            lambda v: _range(
                v["zombie_threshold"] - v["heartbeat_interval"],
                v["zombie_threshold"] + v["sweep_interval"],
            ),
        ),
        (
            "a pause longer than this may be taken for a dead worker "
            "(`zombie_threshold - heartbeat_interval`)",
            lambda v: _s(v["zombie_threshold"] - v["heartbeat_interval"]),
        ),
        (
            f"last sweep finished → workers' fallback sweep (`{MISSED_SWEEPS} x sweep_interval` "
            f"to `{MISSED_SWEEPS + 1} x sweep_interval + heartbeat_interval`)",
            lambda v: _range(
                MISSED_SWEEPS * v["sweep_interval"],
                (MISSED_SWEEPS + 1) * v["sweep_interval"] + v["heartbeat_interval"],
            ),
        ),
        (
            "queued, never started → published again (`queued_timeout` + up to one sweep)",
            lambda v: _range(v["queued_timeout"], v["queued_timeout"] + v["sweep_interval"]),
        ),
        (
            "delivery old enough for the redundant-delivery check (`queued_timeout / 2`)",
            lambda v: _s(v["queued_timeout"] / 2),
        ),
    )
    for label, compute in derived:
        lines.append(f"| {label} | " + " | ".join(compute(PRESETS[p]) for p in names) + " |")
    return "\n".join(lines) + "\n"


def render_tuning(current: str) -> str:
    """``docs/tuning.md`` with its generated presets table replaced."""
    start, end = current.find(BEGIN), current.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{TUNING} lacks the markers {BEGIN!r} ... {END!r}")
    return current[: start + len(BEGIN)] + "\n" + render_presets_table() + current[end:]


def expected_files(docs_dir: Path = DOCS_DIR) -> dict[Path, str]:
    """Each generated file and the text it should have."""
    tuning = docs_dir / TUNING
    return {
        docs_dir / CONFIGURATION: render_configuration(),
        tuning: render_tuning(tuning.read_text(encoding="utf-8")),
    }


def stale_files(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """The generated files whose text differs from what the settings give."""
    return [
        path
        for path, text in expected_files(docs_dir).items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=REGENERATE, description="Regenerate the configuration reference in docs/."
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if out of date; write nothing")
    parser.add_argument("--docs-dir", type=Path, default=DOCS_DIR, help="default: %(default)s")
    args = parser.parse_args(argv)
    missing = problems()
    for problem in missing:
        print(f"error: {problem}", file=sys.stderr)
    stale = stale_files(args.docs_dir)
    if args.check:
        for path in stale:
            print(f"{path} is out of date; run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale or missing else 0
    for path, text in expected_files(args.docs_dir).items():
        if path in stale:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 1 if missing else 0


def _section(spec: SettingSpec, timing: list[str]) -> list[str]:
    _, allowed = parser_description(spec.parse) or ("", "")
    rows = [
        f"### `{spec.conf_key}`",
        "",
        _markdown(spec.doc),
        "",
        f"- Environment: `{spec.env_var}`",
        f"- Type: {_type(spec)}. Allowed: {allowed}",
        f"- Default: {_value(spec, spec.default)}",
    ]
    if spec.name in timing:
        presets = ", ".join(f"`{p}` {_value(spec, v[spec.name])}" for p, v in PRESETS.items())
        rows.append(f"- Per preset: {presets}")
    if spec.name == "preset":
        rows.append("- Presets: " + ", ".join(f"`{p}`" for p in PRESETS))
    return [*rows, ""]


def _validation() -> list[str]:
    n = MIN_HEARTBEATS_PER_THRESHOLD
    schemes = ", ".join(f"`{s}`" for s in sorted(SUPPORTED_SCHEMES))
    return [
        "## Validation",
        "",
        "`Recovery(app)` refuses bad settings with a `celery_recovery.ConfigurationError` "
        "naming the setting, the value and what is allowed (the CLI prints it as one line "
        "and exits 2):",
        "",
        "- Every duration is a positive, finite number of seconds.",
        f"- `{PREFIX}zombie_threshold` and `{PREFIX}health_check_threshold` are at least "
        f"{n} x `{PREFIX}heartbeat_interval`: one late heartbeat (a GC pause, a slow "
        "commit) must not make a live process look dead.",
        f"- `{PREFIX}sweep_interval` is at most `{PREFIX}zombie_threshold` and "
        f"`{PREFIX}health_check_threshold`: otherwise zombies, dead beats and triggerers, "
        "and the triggers they held, would wait longer than the thresholds promise.",
        f"- These relations are checked on the final values, presets included: "
        f"`{PREFIX}preset = 'aggressive'` with `{PREFIX}heartbeat_interval = 5` is refused.",
        f"- `{PREFIX}database_url` uses one of {schemes}; SQLite needs a file (an in-memory "
        "database is not shared between processes).",
        f"- An unknown `{PREFIX}*` key in `app.conf`, `{ENV_PREFIX}*` environment variable "
        "or keyword argument is refused, with the nearest known name.",
        "",
    ]


def _type(spec: SettingSpec) -> str:
    kind, _ = parser_description(spec.parse) or ("", "")
    return f"{kind} ({spec.unit})" if spec.unit and kind != "Seconds" else kind


def _value(spec: SettingSpec, value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float) and spec.unit:
        return f"{value:g} {spec.unit}"
    return f"`{value}`"


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


def _range(low: float, high: float) -> str:
    return f"{low:g}-{high:g} s"


def _markdown(text: str) -> str:
    """reST inline markup of docstrings as Markdown."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


if __name__ == "__main__":
    sys.exit(main())
