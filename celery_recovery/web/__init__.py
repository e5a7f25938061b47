"""The read-only web console: ``celery-recovery web``.

Small modules: :mod:`.readonly` (a read-only connection), :mod:`.overview`
and :mod:`.queries` (what each page shows), :mod:`.app` (routes, pages and
their JSON twins),
:mod:`.security` (who may look, response headers), :mod:`.chart` (inline SVG)
and :mod:`.serve` (uvicorn).  It reads the store and never imports the
sweeps or signals.  Needs ``pip install celery-recovery[web]``.
"""
