"""Code generation: CUDA C for the pointwise segments of a host program (`hir.launch_kernel`).

Code generation has two halves. The *body* depends only on the segment: one
`__device__` function that takes one stored element per load and computes every
output element in registers (`body.py`, with the C of each op and element type in
`expressions.py`). Which element of an input a thread reads follows from torch
broadcasting (operands align on their last axes; `fusion.broadcast` inserts axes), so
every input is read through an *axis map*: the axes of the iteration space its own axes
walk. The *kernel* around the body depends on the buffers' layout (`layout.py`): the
iteration space with mergeable axes merged, which accesses are linear (element i of the
space is element i of the buffer), which axes of the others are broadcast (stride 0),
and how many elements a thread moves per vector access. Sizes, strides and pointers are
kernel arguments, so the generated source (`source.py`) is exactly what the compiled
code depends on, and it is the cache key of `kernels.py`, which compiles and launches.
"""
