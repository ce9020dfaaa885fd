"""What the passes share: analyses of fusions and host programs, and the small builders of
the ops that several passes insert. A pass imports from here, never from another pass.

`axis_mapping.py`: which operand axis feeds which output axis. `operands.py`: operands as
the user knows them, for messages. `sharding.py`: where a fusion op computes, and what
moves its operands there. `loops.py`: the stream loops of `stream-parallel` and the index
values their bodies use. `extents.py`: what an extent is known to equal before the
program runs. `buffers.py`: buffer liveness, who uses a buffer until when. `cost_model.py`:
how many chunks and streams a pipelined GEMM and its communication take.
"""
