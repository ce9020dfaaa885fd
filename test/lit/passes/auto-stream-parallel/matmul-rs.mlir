// RUN: hir-opt %s -p auto-stream-parallel | filecheck %s
// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering | filecheck %s --check-prefix=LOOP

// A GEMM, its bias, and the reduce-scatter of the sum, the product computed in chunks
// (axis 2: two chunks of each destination's rows, as the torch importer cuts them): the
// chunk axis becomes the stream axis of the three, so that each chunk's reduce-scatter
// runs while the next chunk's GEMM does.

!a = !fusion.tensor<[2, 2, 2, 4, 16], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
!b = !fusion.tensor<[2, 1, 1, 16, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
!p = !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
!bias = !fusion.tensor<[8], f32, mesh = [0, 1]>
!out = !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>

func.func @matmul_rs(%a: !a, %b: !b, %bias: !bias) -> !out {
  %p = fusion.matmul %a, %b : (!a, !b) -> !p
  %q = fusion.add %p, %bias : (!p, !bias) -> !p
  %out = fusion.sum %q [0] : !p -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @matmul_rs(
// CHECK-SAME:      -> !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _]>
// CHECK:         fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, stream, _, _]>
// CHECK-NEXT:    fusion.add {{.*}} -> !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, stream, _, _]>
// CHECK-NEXT:    fusion.sum {{.*}} -> !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _]>

// LOOP:          scf.for
// LOOP:            hir.matmul
// LOOP:            hir.launch_kernel
// LOOP:            hir.reduce_scatter
// LOOP:            hir.wait
// LOOP:          }
