#!/bin/sh
# elsewhere.sh HOSTNAME OFFSET COMMAND...: run COMMAND as on another host whose wall clock
# is OFFSET off (libfaketime, e.g. "-60s"), in a UTS namespace of its own (run it under
# `unshare --uts`, as root), so that its host name is HOSTNAME.  Only the wall clock is
# faked: a faked monotonic clock makes every timed wait hang, and Python's time.sleep is
# replaced where the real one fails (faketime_site/sitecustomize.py).
host=$1
offset=$2
shift 2
export FAKETIME_DONT_FAKE_MONOTONIC=1
export PYTHONPATH="$(dirname "$0")/faketime_site${PYTHONPATH:+:$PYTHONPATH}"
hostname "$host" && exec faketime -f "$offset" "$@"
