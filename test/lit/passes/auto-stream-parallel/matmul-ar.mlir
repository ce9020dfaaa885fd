// RUN: hir-opt %s -p auto-stream-parallel | filecheck %s
// RUN: hir-opt %s -p auto-stream-parallel,hir-lowering | filecheck %s --check-prefix=LOOP

// A K-sharded GEMM and the allreduce of its product, the rows computed in chunks (axis
// 1: two chunks, as the torch importer cuts them): the chunk axis becomes the stream
// axis of both, so that each chunk's allreduce runs while the next chunk's GEMM does.

!a = !fusion.tensor<[2, 2, 4, 16], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!b = !fusion.tensor<[2, 1, 16, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!p = !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!out = !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1]>

func.func @matmul_ar(%a: !a, %b: !b) -> !out {
  %p = fusion.matmul %a, %b : (!a, !b) -> !p
  %out = fusion.sum %p [0] : !p -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @matmul_ar(
// CHECK-SAME:      -> !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [stream, _, _]>
// CHECK:         fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _]>
// CHECK-NEXT:    fusion.sum {{.*}} -> !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [stream, _, _]>

// LOOP:          scf.for
// LOOP:            hir.matmul
// LOOP:            hir.allreduce
// LOOP:            hir.wait
// LOOP:          }

// A GEMM with a bias (nn.Linear's, which ATen adds in the GEMM): the bias, the same
// for every chunk, is read at its extent-1 chunk axis by every iteration.

!bias = !fusion.tensor<[2, 1, 1, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>

func.func @biased_matmul_ar(%a: !a, %b: !b, %bias: !bias) -> !out {
  %p = fusion.matmul %a, %b, %bias : (!a, !b, !bias) -> !p
  %out = fusion.sum %p [0] : !p -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @biased_matmul_ar(
// CHECK:         fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _]>
// CHECK-NEXT:    fusion.sum {{.*}} -> !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [stream, _, _]>

// LOOP-LABEL:    func.func @biased_matmul_ar(
// LOOP:          scf.for %[[I:.*]] = %c0
// LOOP:            %[[BIAS:.*]] = hir.alias_select %bias[1 = %c0]
// LOOP:            hir.matmul ins(%{{.*}}, %{{.*}}, %[[BIAS]] :
// LOOP:            hir.allreduce
// LOOP:            hir.wait
// LOOP:          }

// Without chunks, the first axis is the rows, the matmul's M axis: nothing streams.

!a1 = !fusion.tensor<[2, 8, 16], f32, mesh = [0, 1], axes = [didx, _, _]>
!b1 = !fusion.tensor<[2, 16, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
!p1 = !fusion.tensor<[2, 8, 8], f32, mesh = [0, 1], axes = [didx, _, _]>
!out1 = !fusion.tensor<[8, 8], f32, mesh = [0, 1]>

func.func @rows_not_chunks(%a: !a1, %b: !b1) -> !out1 {
  %p = fusion.matmul %a, %b : (!a1, !b1) -> !p1
  %out = fusion.sum %p [0] : !p1 -> !out1
  func.return %out : !out1
}

// CHECK-LABEL: func.func @rows_not_chunks(
// CHECK-NOT:     stream
// CHECK:         func.return
