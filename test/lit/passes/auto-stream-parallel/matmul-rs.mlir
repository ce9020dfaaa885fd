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

// Without chunks, the axis after the scattered one is the rows of each destination, the
// matmul's M axis: slices of it are not slices of a batched product, so nothing streams.

!a1 = !fusion.tensor<[2, 2, 4, 16], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!b1 = !fusion.tensor<[2, 1, 16, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!p1 = !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _, _]>
!out1 = !fusion.tensor<[2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, _]>

func.func @rows_not_chunks(%a: !a1, %b: !b1) -> !out1 {
  %p = fusion.matmul %a, %b : (!a1, !b1) -> !p1
  %out = fusion.sum %p [0] : !p1 -> !out1
  func.return %out : !out1
}

// CHECK-LABEL: func.func @rows_not_chunks(
// CHECK-NOT:     stream
// CHECK:         func.return

// A sum of two GEMMs (a gradient through two projections), reduce-scattered: both GEMMs
// and the sum stream with the reduce-scatter.

!c = !fusion.tensor<[2, 2, 2, 4, 32], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>
!d = !fusion.tensor<[2, 1, 1, 32, 8], f32, mesh = [0, 1], axes = [didx, _, _, _, _]>

func.func @sum_of_gemms(%a: !a, %b: !b, %c: !c, %d: !d) -> !out {
  %p = fusion.matmul %a, %b : (!a, !b) -> !p
  %q = fusion.matmul %c, %d : (!c, !d) -> !p
  %s = fusion.add %p, %q : (!p, !p) -> !p
  %out = fusion.sum %s [0] : !p -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @sum_of_gemms(
// CHECK:         fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, stream, _, _]>
// CHECK-NEXT:    fusion.matmul {{.*}} -> !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, stream, _, _]>
// CHECK-NEXT:    fusion.add {{.*}} -> !fusion.tensor<[2, 2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, _, stream, _, _]>
// CHECK-NEXT:    fusion.sum {{.*}} -> !fusion.tensor<[2, 2, 4, 8], f32, mesh = [0, 1], axes = [didx, stream, _, _]>

// LOOP-LABEL:    func.func @sum_of_gemms(
// LOOP:          scf.for
// LOOP:            hir.matmul
// LOOP:            hir.matmul
// LOOP:            hir.reduce_scatter
// LOOP:          }
