// A set that insert-reshardings inserts has the location of the op it is inserted
// for, and so have the hir ops fusion-to-hir lowers it to (the allocation of the
// gathered buffer, the allgather and its wait): an error at run time in them points
// at the user's line.
// RUN: hir-opt %s -p insert-reshardings --print-debuginfo | filecheck %s --check-prefix=SET -DFILE=%s
// RUN: hir-opt %s -p hir-lowering --print-debuginfo | filecheck %s --check-prefix=HIR -DFILE=%s

!in = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [stream, _, _, _]>

func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}
// SET: %[[G:[^ ]+]] = fusion.set %in : {{.*}} loc("[[FILE]]":[[# @LINE - 3]]:3)
// SET-NEXT: fusion.linear %[[G]], %w, %b : {{.*}} loc("[[FILE]]":[[# @LINE - 4]]:3)

// HIR: %[[GATHERED:[0-9]+]] = hir.allocate({{.*}} loc("[[FILE]]":[[# @LINE - 6]]:3)
// HIR: %[[WORK:[^ ]+]] = hir.allgather %{{[^ ]+}} into {{.*}} loc("[[FILE]]":[[# @LINE - 7]]:3)
// HIR-NEXT: hir.wait %[[WORK]] loc("[[FILE]]":[[# @LINE - 8]]:3)
// HIR: hir.linear {{.*}} loc("[[FILE]]":[[# @LINE - 9]]:3)
// HIR-NOT: hir.allgather
