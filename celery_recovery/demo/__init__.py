"""``celery-recovery demo``: watch a SIGKILLed worker's task being recovered, no servers needed."""
