"""What the doctor reports: findings (with their fix), what it could not tell, and what
it read to reach them; and the exit status they make."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum, StrEnum
from typing import Any


class Severity(StrEnum):
    #: Tasks are lost or run twice in ordinary operation (memory pressure, a long task).
    ERROR = "error"
    #: Tasks are lost or run twice when something else happens too (a restart, a pause).
    WARNING = "warning"


class ExitStatus(IntEnum):
    """``celery-recovery doctor``'s exit status."""

    NOTHING_FOUND = 0
    FINDINGS = 1
    CANNOT_TELL = 2


@dataclass(frozen=True)
class Finding:
    """A setting that loses or duplicates tasks silently.

    ``id`` is stable (docs/doctor.md has a section per id); ``subject`` names the
    server, queue, task or setting; ``problem`` says what goes wrong; ``fix`` is the
    exact setting or command that removes it.
    """

    id: str
    severity: Severity
    subject: str
    problem: str
    fix: str


@dataclass(frozen=True)
class Unknown:
    """A question a check could not answer (a server down, a value not readable)."""

    check: str
    subject: str
    reason: str
    fix: str = ""


@dataclass
class Report:
    """Everything one run of the doctor found, could not tell, and read."""

    findings: list[Finding] = field(default_factory=list)
    unknowns: list[Unknown] = field(default_factory=list)
    #: One line per fact read (a server's setting, a task's time limit), for the reader
    #: to check the doctor's reasoning.
    read: list[str] = field(default_factory=list)

    def found(self, id: str, severity: Severity, subject: str, problem: str, fix: str) -> None:
        self.findings.append(Finding(id, severity, subject, problem, fix))

    def cannot_tell(self, check: str, subject: str, reason: str, fix: str = "") -> None:
        self.unknowns.append(Unknown(check, subject, reason, fix))

    def note(self, line: str) -> None:
        self.read.append(line)

    @property
    def exit_status(self) -> ExitStatus:
        """Findings first: a known problem is worth acting on even when others are unknown."""
        if self.findings:
            return ExitStatus.FINDINGS
        if self.unknowns:
            return ExitStatus.CANNOT_TELL
        return ExitStatus.NOTHING_FOUND

    def as_dict(self) -> dict[str, Any]:
        return {
            "exit_status": int(self.exit_status),
            "findings": [asdict(f) | {"severity": f.severity.value} for f in self.findings],
            "cannot_tell": [asdict(u) for u in self.unknowns],
            "read": list(self.read),
        }
