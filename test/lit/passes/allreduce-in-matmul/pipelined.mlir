// RUN: hir-opt %s -p 'hir-lowering{backend=cuda}' | filecheck %s
// RUN: hir-opt %s -p 'hir-lowering{backend=cuda allreduce_in_matmul=false}' | filecheck %s --check-prefix=SEPARATE

// GEMM+AR over two devices on the copy engines (benchmarks/overlap.py's fusion), lowered
// whole: allreduce-in-matmul pairs the chunks, copy-engine-pipelining runs the pairs on
// the caller's stream. Pair i's plain matmul and exchange are issued before pair i - 1's
// wait, after which pair i - 1's accumulating matmul makes its sum, whose pull back is
// issued then and waited for in the next iteration, once pair i + 1's plain matmul is
// issued (the last two after the last pair's accumulating matmul). An odd last chunk
// keeps its allreduce, after the pairs.

!x = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [_, didx, _, _]>
!w = !fusion.tensor<[2, ?, ?], bf16, mesh = [0, 1], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [0, 1], axes = [stream, didx, _, _]>
!y = !fusion.tensor<[?, ?, ?], bf16, mesh = [0, 1], axes = [stream, _, _]>

func.func @matmul_ar(%x: !x, %w: !w) -> !y {
  %partial = fusion.matmul %x, %w : (!x, !w) -> !partial
  %y = fusion.sum %partial [1] : !partial -> !y
  func.return %y : !y
}

// CHECK-LABEL: func.func @matmul_ar(
// CHECK:         %[[OWN:[^ ]+]] = arith.select %{{.*}}, %c1, %c0 : index
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select %{{.*}}, %c0, %c1 : index
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK:         %[[Y:[^ ]+]] = hir.allocate(
// CHECK:         %[[PAIRS:[^ ]+]] = arith.divui
// CHECK:         %[[HAS_LAST:[^ ]+]] = arith.cmpi ne
// CHECK:         scf.if
// CHECK:           hir.matmul ins(
// CHECK:           hir.start_coalescing
// CHECK-NEXT:      hir.send %{{.*}} to %[[PEER]] backend cuda
// CHECK-NEXT:      hir.recv %{{.*}} from %[[PEER]] backend cuda
// CHECK-NEXT:      %[[FIRST:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      %[[LAST:[^ ]+]], %[[LAST_SUM:[^ ]+]] = scf.for %[[I:[^ ]+]] = %c1 to %[[PAIRS]] step %c1 iter_args(%[[PREVIOUS:[^ ]+]] = %[[FIRST]], %[[PREVIOUS_SUM:[^ ]+]] = %[[FIRST]]) -> (!hir.work, !hir.work) {
// CHECK:             %[[TO_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]]
// CHECK-NEXT:        hir.matmul ins(%{{.*}}, %{{.*}}) outs(%[[TO_PEER]] :
// CHECK:             %[[W:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        %[[BEFORE:[^ ]+]] = arith.subi %[[I]], %c1 : index
// CHECK:             %[[FOR_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]]
// CHECK-NEXT:        hir.wait %[[PREVIOUS]]
// CHECK-NEXT:        hir.wait %[[PREVIOUS_SUM]]
// CHECK-NEXT:        %[[PEER_ROWS:[^ ]+]] = hir.alias_select %{{.*}}[0 = %{{.*}}]
// CHECK-NEXT:        hir.matmul accumulate ins(%[[PEER_ROWS]], %{{.*}}) outs(%[[FOR_PEER]] :
// CHECK-NEXT:        %[[SUM:[^ ]+]] = hir.alias_select %[[FOR_PEER]][0 = %c0]
// CHECK-NEXT:        %[[OWN_OUT:[^ ]+]] = hir.alias_select %[[Y]]
// CHECK-NEXT:        %[[PEER_OUT:[^ ]+]] = hir.alias_select %[[Y]]
// CHECK-NEXT:        hir.start_coalescing
// CHECK-NEXT:        hir.send %[[SUM]] to %[[PEER]] backend cuda
// CHECK-NEXT:        hir.recv %[[OWN_OUT]] from %[[PEER]] backend cuda
// CHECK-NEXT:        %[[SUMMED:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.copy ins(%[[SUM]] : {{.*}}) outs(%[[PEER_OUT]] :
// CHECK-NEXT:        scf.yield %[[W]], %[[SUMMED]] : !hir.work, !hir.work
// CHECK-NEXT:      }
// CHECK:           hir.wait %[[LAST]]
// CHECK-NEXT:      hir.alias_select
// CHECK-NEXT:      hir.matmul accumulate
// CHECK:           %[[LAST_SUMMED:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      hir.copy
// CHECK-NEXT:      hir.wait %[[LAST_SUM]]
// CHECK-NEXT:      hir.wait %[[LAST_SUMMED]]
// CHECK-NEXT:    } else {
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.if %[[HAS_LAST]] {
// CHECK:           hir.allreduce {{.*}} team [0, 1] op sum backend cuda
// CHECK:         hir.deallocate %[[PARTIAL]]

// SEPARATE-LABEL: func.func @matmul_ar(
// SEPARATE-NOT:     accumulate
// SEPARATE:         hir.allreduce %{{.*}} into %{{.*}} team [0, 1] op sum backend cuda
// SEPARATE-NOT:     accumulate
