"""hostir's dialects: `fusion` (sharded tensor programs) and `hir` (host programs)."""

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.dialects.scf import Scf
from xdsl.dialects.shard import Shard

from hostir_dialect.fusion import Fusion
from hostir_dialect.hir import Hir

DIALECTS = (Builtin, Func, Arith, Scf, Shard, Fusion, Hir)
"""Every dialect a hostir program may use: hir reuses shard's reduction kinds."""


def hostir_context() -> Context:
    """A context that knows every dialect of `DIALECTS`."""
    ctx = Context()
    for dialect in DIALECTS:
        ctx.load_dialect(dialect)
    return ctx
