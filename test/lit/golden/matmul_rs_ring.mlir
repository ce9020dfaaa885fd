// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda reduce_scatter_ring=false}' | filecheck %s --check-prefix=COLLECTIVE

// GEMM+RS over four devices on the copy engines (benchmarks/overlap.py's fusion): no
// reduce-scatter is left. Each chunk is a ring of destinations: the rows of the member
// 1, 2 and 3 places ahead computed and sent in turn, the own rows last, into a staging
// buffer of two slices; chunk i's ring is issued before chunk i - 1's three waits and
// reduction, and the last chunk's follow the loop (reduce-scatter-ring, then
// copy-engine-pipelining); a kernel of the four pieces makes each reduction, all of them
// one segment (reduction-in-kernel).

!x = !fusion.tensor<[?, 4, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [_, didx, _, _, _]>
!w = !fusion.tensor<[4, 1, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [didx, _, _, _]>
!partial = !fusion.tensor<[?, 4, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _, _]>
!y = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>

func.func @matmul_rs(%x: !x, %w: !w) -> !y {
  %partial = fusion.matmul %x, %w : (!x, !w) -> !partial
  %y = fusion.sum %partial [1] : !partial -> !y
  func.return %y : !y
}

// CHECK-LABEL: func.func private @matmul_rs_reduction_0(
// CHECK-NOT:     func.func private
// CHECK-LABEL: func.func @matmul_rs(
// CHECK-NOT:     hir.reduce_scatter
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK-NEXT:    %[[SLOTS:[^ ]+]] = arith.minui %{{.*}}, %c2 : index
// CHECK-NEXT:    %[[STAGING:[^ ]+]] = hir.allocate(%[[SLOTS]], {{.*}}) : !fusion.tensor<[?, 4, 4, ?, ?], bf16
// CHECK:         scf.if
// CHECK-COUNT-3:   hir.end_coalescing
// CHECK:           %[[OWN:own_rows[^ ]*]] = hir.alias_select
// CHECK-NEXT:      hir.matmul ins({{.*}}) outs(%[[OWN]] :
// CHECK-NEXT:      %last_work, %last_work_1, %last_work_2 = scf.for %{{.*}} = %c1 to %{{.*}} step %c1 iter_args({{.*}}) -> (!hir.work, !hir.work, !hir.work) {
// CHECK-COUNT-3:     hir.end_coalescing
// CHECK:             hir.matmul ins({{.*}}) outs(%own_rows
// CHECK:             hir.wait %previous_work
// CHECK-NEXT:        hir.wait %previous_work
// CHECK-NEXT:        hir.wait %previous_work
// CHECK-COUNT-4:     hir.alias_select
// CHECK-NEXT:        hir.launch_kernel @matmul_rs_reduction_0 ins(%slice, %slice_1, %slice_2, %slice_3 :
// CHECK-NEXT:        scf.yield
// CHECK:           hir.wait %last_work
// CHECK-NEXT:      hir.wait %last_work
// CHECK-NEXT:      hir.wait %last_work
// CHECK-COUNT-4:   hir.alias_select
// CHECK-NEXT:      hir.launch_kernel @matmul_rs_reduction_0 ins(%slice_4, %slice_5, %slice_6, %slice_7 :
// CHECK-NOT:       hir.reduction
// CHECK:         hir.deallocate %[[STAGING]]

// Without the ring, each chunk's product is reduce-scattered whole, pipelined the same way.
// COLLECTIVE-LABEL: func.func @matmul_rs(
// COLLECTIVE-NOT:   hir.send
// COLLECTIVE:       hir.reduce_scatter {{.*}} team [0, 1, 2, 3] op sum backend cuda
// COLLECTIVE:       scf.for
// COLLECTIVE:         hir.reduce_scatter {{.*}} team [0, 1, 2, 3] op sum backend cuda
// COLLECTIVE-NOT:   hir.send
