"""The distributed backend of the runtime: how a rank talks to its peers and orders its work.

`communicator.py` is one rank's view of torch.distributed with every communication of the
hir dialect; `copy_engine.py` moves the bytes of `backend cuda` with the GPUs' copy
engines, through `signals.py` (stream memory operations between devices) and under the
`watchdog.py` (a dead peer ends the process instead of hanging it); `work.py` holds what
both share; `streams.py` is the stream pool. Nothing here knows of host programs: the
interpreter (`hostir.runtime.interpreter`) calls these for its ops.
"""
