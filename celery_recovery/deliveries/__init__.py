"""What happens to one delivery on a worker, around its body.

A redundant delivery is dropped (:mod:`.redundant_deliveries`); ``@recoverable`` guards
side effects with an idempotency lock (:mod:`.recoverable`), and a duplicate of a held key
runs again later as the same try (:mod:`.postpone`); ``defer()`` gives up the worker slot
until a trigger fires (:mod:`.deferral`); a try whose pool process died (:mod:`.worker_lost`)
or was killed at its hard time limit (:mod:`.time_limits`) is ended; a chord's body is
published once (:mod:`.canvas`).
"""
