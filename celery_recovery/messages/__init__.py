"""What travels: a task's message and its record, publishing a try again, asking the result backend.

:mod:`.headers` declares every header name (and record key) of ours, once;
:mod:`.records` turns a published message or a running request into a task record (JSON,
never pickled); :mod:`.republish` publishes a recorded try again as its next try, on SQS
after a dead worker's open receives have ended (:mod:`.dead_receives`); :mod:`.resends`
marks what a task run again publishes again; :mod:`.result_backends` says what each kind
of result backend can tell and how results reach the caller, and :mod:`.backend_probe`
asks it what became of a try.
"""
