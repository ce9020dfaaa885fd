// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda reduce_scatter_in_matmul=false}' | filecheck %s --check-prefix=SEPARATE

// GEMM+RS over two devices on the copy engines (benchmarks/overlap.py's fusion): no
// reduce-scatter is left. Chunk i's matmul of the peer's rows and its exchange are
// issued before chunk i - 1's wait, after which chunk i - 1's own rows are added into
// the output by the accumulating matmul; the last chunk's wait and matmul follow the
// loop (reduce-scatter-in-matmul, then copy-engine-pipelining).

!x = !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _, _]>
!w = !fusion.tensor<[2, 1, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _, _]>
!partial = !fusion.tensor<[?, 2, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _, _]>
!y = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _]>

func.func @matmul_rs(%x: !x, %w: !w) -> !y {
  %partial = fusion.matmul %x, %w : (!x, !w) -> !partial
  %y = fusion.sum %partial [1] : !partial -> !y
  func.return %y : !y
}

// CHECK-LABEL: func.func @matmul_rs(
// CHECK-NOT:     hir.reduce_scatter
// CHECK:         %[[OWN:[^ ]+]] = arith.select %{{.*}}, %c1, %c0 : index
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select %{{.*}}, %c0, %c1 : index
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK:         %[[Y:[^ ]+]] = hir.allocate(
// CHECK:         scf.if
// CHECK:           hir.matmul ins(
// CHECK-NEXT:      hir.alias_select %[[Y]]
// CHECK-NEXT:      hir.start_coalescing
// CHECK-NEXT:      hir.send %{{.*}} to %[[PEER]] backend cuda
// CHECK-NEXT:      hir.recv %{{.*}} from %[[PEER]] backend cuda
// CHECK-NEXT:      %[[FIRST:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %c1 to %{{.*}} step %c1 iter_args(%[[PREVIOUS:[^ ]+]] = %[[FIRST]]) -> (!hir.work) {
// CHECK:             %[[PEER_ROWS:[^ ]+]] = hir.alias_select %{{.*}}[1 = %[[PEER]]]
// CHECK:             %[[TO_PEER:to_peer[^ ]*]] = hir.alias_select %{{.*}}[1 = %c0]
// CHECK-NEXT:        hir.matmul ins(%[[PEER_ROWS]], %{{.*}}) outs(%[[TO_PEER]] :
// CHECK-NEXT:        hir.alias_select %[[Y]]
// CHECK-NEXT:        hir.start_coalescing
// CHECK-NEXT:        hir.send %[[TO_PEER]] to %[[PEER]] backend cuda
// CHECK-NEXT:        hir.recv %[[Y_I:[^ ]+]] from %[[PEER]] backend cuda
// CHECK-NEXT:        %[[W:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        %[[BEFORE:[^ ]+]] = arith.subi %[[I]], %c1 : index
// CHECK:             %[[Y_BEFORE:[^ ]+]] = hir.alias_select %[[Y]][0 = %[[BEFORE]]]
// CHECK-NEXT:        hir.wait %[[PREVIOUS]]
// CHECK-NEXT:        %[[OWN_ROWS:[^ ]+]] = hir.alias_select %{{.*}}[1 = %[[OWN]]]
// CHECK-NEXT:        hir.matmul accumulate ins(%[[OWN_ROWS]], %{{.*}}) outs(%[[Y_BEFORE]] :
// CHECK-NEXT:        scf.yield %[[W]] : !hir.work
// CHECK-NEXT:      }
// CHECK:           hir.wait %[[LAST]]
// CHECK-NEXT:      %{{.*}} = hir.alias_select %{{.*}}[1 = %[[OWN]]]
// CHECK-NEXT:      hir.matmul accumulate
// CHECK-NEXT:    } else {

// SEPARATE-LABEL: func.func @matmul_rs(
// SEPARATE-NOT:     accumulate
// SEPARATE:         hir.reduce_scatter %{{.*}} into %{{.*}} team [0, 1] op sum backend cuda
// SEPARATE-NOT:     accumulate
