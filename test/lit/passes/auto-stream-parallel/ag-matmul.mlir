// RUN: hir-opt %s -p auto-stream-parallel | filecheck %s
// RUN: hir-opt %s -p auto-stream-parallel > %t && hir-opt %t -p auto-stream-parallel | diff %t -
// RUN: hir-opt %s -p 'auto-stream-parallel{enabled=false}' | filecheck %s --check-prefix=OFF
// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering | filecheck %s --check-prefix=RING

// An all-gather that a matmul reads, written without a stream axis (as torch.compile's
// graphs are imported): the gathered axis becomes the stream axis of the gather and of
// the matmul, and the other reader of the gathered tensor reads a copy made after the
// ring, placed after the matmul so that the two loops merge.

!x = !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _]>
!g = !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1]>
!w = !fusion.tensor<[2, 16, 32], f32, mesh = [0, 1], axes = [didx, _, _]>
!wb = !fusion.tensor<[2, 1, 16, 32], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!y = !fusion.tensor<[2, 2, 8, 32], f32, mesh = [0, 1], axes = [didx, _, _, _]>

func.func @ag_matmul(%x: !x, %w: !w) -> (!y, !g) {
  %g = fusion.set %x : !x -> !g
  %wb = fusion.broadcast %w [1] : !w -> !wb
  %y = fusion.matmul %g, %wb : (!g, !wb) -> !y
  func.return %y, %g : !y, !g
}

// CHECK-LABEL: func.func @ag_matmul(
// CHECK-SAME:      -> (!fusion.tensor<[2, 2, 8, 32], f32, mesh = [0, 1], axes = [didx, stream, _, _]>, !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1]>)
// CHECK:         %[[WB:[^ ]+]] = fusion.broadcast
// CHECK-NEXT:    %[[G:[^ ]+]] = fusion.set %x : {{.*}} -> !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1], axes = [stream, _, _]>
// CHECK-NEXT:    %[[Y:[^ ]+]] = fusion.matmul %[[G]], %[[WB]] : {{.*}} -> !fusion.tensor<[2, 2, 8, 32], f32, mesh = [0, 1], axes = [didx, stream, _, _]>
// CHECK-NEXT:    %[[WHOLE:[^ ]+]] = fusion.set %[[G]] : {{.*}} -> !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1]>
// CHECK-NEXT:    func.return %[[Y]], %[[WHOLE]]

// OFF-NOT: stream

// The ring of pr4515 and the matmul in one loop:
// RING:          scf.for
// RING:            hir.recv
// RING:            hir.matmul
// RING:          }
// RING:          hir.copy



// The matmul contracts the gathered axis: nothing to pipeline.
!x2 = !fusion.tensor<[2, 8], f32, mesh = [0, 1], axes = [didx, _]>
!g2 = !fusion.tensor<[2, 8], f32, mesh = [0, 1]>
!w2 = !fusion.tensor<[8, 2], f32, mesh = [0, 1]>
!y2 = !fusion.tensor<[8, 8], f32, mesh = [0, 1]>
func.func @contracted(%x: !x2, %w: !w2) -> !y2 {
  %g = fusion.set %x : !x2 -> !g2
  %y = fusion.matmul %w, %g : (!w2, !g2) -> !y2
  func.return %y : !y2
}
