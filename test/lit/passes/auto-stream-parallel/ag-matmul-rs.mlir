// RUN: hir-opt %s -p auto-stream-parallel | filecheck %s
// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering | filecheck %s --check-prefix=LOWERED

// A sequence-parallel pair of projections over two sequences: the all-gathered chunks
// of the sequences are the first matmul's stream axis, and the reduce-scatter's chunks
// would be the sequences, another axis of the second matmul's left operand, which one
// loop cannot run over as well: the reduce-scatter is not pipelined, and the program lowers.

!x = !fusion.tensor<[2, 2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!g = !fusion.tensor<[2, 2, 3, 8], f32, mesh = [0, 1]>
!w = !fusion.tensor<[2, 1, 1, 8, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
!p = !fusion.tensor<[2, 2, 2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>

// CHECK-LABEL: func.func @pair(
// CHECK:         %h = fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 2, 3, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _, _]>
// CHECK:         %y = fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
// CHECK:         %out = fusion.sum %y [0] : !fusion.tensor<[2, 2, 2, 3, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
// LOWERED-LABEL: func.func @pair(
// LOWERED:         scf.for
// LOWERED:         hir.reduce_scatter
func.func @pair(%x: !x, %w1: !w, %w2: !w) -> !x {
  %g = fusion.set %x : !x -> !g
  %h = fusion.matmul %g, %w1 : (!g, !w) -> !p
  %y = fusion.matmul %h, %w2 : (!p, !w) -> !p
  %out = fusion.sum %y [0] : !p -> !x
  func.return %out : !x
}
