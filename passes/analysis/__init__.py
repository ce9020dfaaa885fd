"""What the passes share: analyses of fusions and host programs, and the small builders of
the ops that several passes insert. A pass imports from here, never from another pass.

`cost_model.py`: how many chunks and streams a pipelined GEMM and its communication take.
"""
