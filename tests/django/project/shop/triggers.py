"""A trigger of the project's own: the triggerer may import it because ``shop`` is the
package of the app's tasks (found only once the app is started as a worker starts it)."""

import asyncio
import os
from datetime import UTC, datetime

from celery_recovery import BaseTrigger, TaskSuccessEvent


class Ready(BaseTrigger):
    """Succeeds the deferred task at ``at`` (ISO time) with the triggerer's pid."""

    def __init__(self, at: str) -> None:
        self.at = at

    def serialize(self) -> tuple[str, dict[str, str]]:
        return "shop.triggers.Ready", {"at": self.at}

    async def run(self):
        left = (datetime.fromisoformat(self.at) - datetime.now(UTC)).total_seconds()
        await asyncio.sleep(max(left, 0.0))
        yield TaskSuccessEvent({"ready": self.at, "pid": os.getpid()})
