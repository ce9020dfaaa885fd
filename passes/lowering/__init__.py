"""From a fusion to a host program: `fusion-to-hir` (buffers, compute and communication ops,
segments) and `stream-parallel` (each stream-parallel op in a loop over CUDA streams: its
checks in `stream_axis_checks.py`, the slicing of its segments in `segment_slicing.py`).
`peer_readable.py` makes the buffers that the copy-engine transfers of both read symmetric."""
