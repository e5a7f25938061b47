"""What recovery reports to an operator's tools: Prometheus metrics and Sentry.

:mod:`.metrics` defines, records and serves the Prometheus metrics; :mod:`.sentry` sends
zombies, lost messages and dead beats as Sentry events, and the sweep's and triggerer's
cron check-ins, when ``sentry-sdk`` is installed and initialised.
"""
