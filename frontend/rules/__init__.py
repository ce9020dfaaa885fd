"""The importer's rules: one per ATen op or functional collective that the fusion dialect
models, registered in the importer's `RULES` as their modules are imported (any other op
becomes a `fusion.aten`). `attention.py`: ATen's attention kernels, and the refusal of
torch's own context parallel; `collectives.py`: the functional collectives and the chunks of
their pipelines; `matmuls.py`; `pointwise.py`: pointwise ops, activations, casts and
reductions; `reshapes.py`: reshapes, whole slices and the concatenation of a split.
"""

from hostir.frontend.rules import attention, collectives, matmuls, pointwise, reshapes  # noqa: F401  (their rules register)
