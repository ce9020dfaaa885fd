// RUN: hir-opt %s --split-input-file -p allreduce-in-matmul | filecheck %s
// RUN: hir-opt %s --split-input-file -p allreduce-in-matmul > %t && hir-opt %s --split-input-file -p allreduce-in-matmul,allreduce-in-matmul | diff %t -

// GEMM+AR over two devices on the copy engines, as stream-parallel makes it: the loop
// over chunks becomes a loop over pairs of chunks (and its synchronisation loop with
// it). In pair i, each device multiplies chunk 2i + own into slice 2i of the partial
// sums (the slice both send, so the one each reads on its peer), pulls the peer's
// product of chunk 2i + peer into slice 2i + 1, adds its own product of that chunk into
// it (`accumulate`), lets the peer pull that sum into its output, pulls the peer's sum
// of chunk 2i + own into its own, and copies the sum it made into its output. An odd
// last chunk keeps its allreduce, after the loops.

!a = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!b = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!chunk_a = !fusion.tensor<[2, ?, ?], f32, mesh = [0, 1], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 2, ?, ?], f32, mesh = [0, 1], axes = [stream, didx, _, _]>
!out = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1], axes = [stream, _, _]>
!chunk_out = !fusion.tensor<[?, ?], f32, mesh = [0, 1]>

func.func @matmul_ar(%a: !a, %b: !b) -> !out {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %0 = hir.dim %a, 0 : !a
  %1 = hir.dim %a, 2 : !a
  %2 = hir.dim %b, 2 : !b
  %partial = hir.allocate(%0, %1, %2) symmetric : !partial
  %extent = hir.dim %partial, 0 : !partial
  %out = hir.allocate(%0, %1, %2) : !out
  scf.for %i = %c0 to %extent step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    hir.synchronize_stream %main_stream
  }
  scf.for %i_1 = %c0 to %extent step %c1 {
    %stream_index_1 = arith.remui %i_1, %num_streams : index
    %stream_1 = hir.stream %stream_index_1
    hir.set_current_stream %stream_1
    %a_slice = hir.alias_select %a[0 = %i_1] : !a -> !chunk_a
    %partial_slice = hir.alias_select %partial[0 = %i_1] : !partial -> !chunk_a
    hir.matmul ins(%a_slice, %b : !chunk_a, !b) outs(%partial_slice : !chunk_a)
    %out_slice = hir.alias_select %out[0 = %i_1] : !out -> !chunk_out
    %work = hir.allreduce %partial_slice into %out_slice team [0, 1] op sum backend cuda : !chunk_a, !chunk_out
    hir.wait %work
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream_1
  }
  func.return %out : !out
}

// CHECK-LABEL: func.func @matmul_ar(
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK:         %[[RANK:[^ ]+]] = hir.device_index
// CHECK-NEXT:    %[[SECOND:[^ ]+]] = arith.cmpi eq, %[[RANK]], %[[C1]] : index
// CHECK-NEXT:    %[[OWN:[^ ]+]] = arith.select %[[SECOND]], %[[C1]], %[[C0]] : index
// CHECK-NEXT:    %[[PEER:[^ ]+]] = arith.select %[[SECOND]], %[[C0]], %[[C1]] : index
// CHECK-NEXT:    %[[PEER_DEVICE:[^ ]+]] = arith.select %[[SECOND]], %[[C0]], %[[C1]] : index
// CHECK:         %[[PARTIAL:[^ ]+]] = hir.allocate({{.*}}) symmetric
// CHECK-NEXT:    %[[EXTENT:[^ ]+]] = hir.dim %[[PARTIAL]], 0
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate(
// CHECK-NEXT:    %[[PAIRS:[^ ]+]] = arith.divui %[[EXTENT]], %[[C2]] : index
// CHECK-NEXT:    %[[ODD:[^ ]+]] = arith.remui %[[EXTENT]], %[[C2]] : index
// CHECK-NEXT:    %[[HAS_LAST:[^ ]+]] = arith.cmpi ne, %[[ODD]], %[[C0]] : index
// CHECK-NEXT:    scf.for %{{.*}} = %[[C0]] to %[[PAIRS]] step %[[C1]] {
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %[[C0]] to %[[PAIRS]] step %[[C1]] {
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      %[[START:[^ ]+]] = arith.muli %[[I]], %[[C2]] : index
// CHECK-NEXT:      %[[SUM_SLICE:[^ ]+]] = arith.addi %[[START]], %[[C1]] : index
// CHECK-NEXT:      %[[OWN_CHUNK:[^ ]+]] = arith.addi %[[START]], %[[OWN]] : index
// CHECK-NEXT:      %[[PEER_CHUNK:[^ ]+]] = arith.addi %[[START]], %[[PEER]] : index
// CHECK-NEXT:      %[[A_OWN:[^ ]+]] = hir.alias_select %a[0 = %[[OWN_CHUNK]]]
// CHECK-NEXT:      %[[TO_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]][0 = %[[START]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_OWN]], %b : {{.*}}) outs(%[[TO_PEER]] :
// CHECK-NEXT:      %[[FOR_PEER:[^ ]+]] = hir.alias_select %[[PARTIAL]][0 = %[[SUM_SLICE]]]
// CHECK-NEXT:      hir.start_coalescing
// CHECK-NEXT:      hir.send %[[TO_PEER]] to %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:      hir.recv %[[FOR_PEER]] from %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:      %[[EXCHANGED:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      hir.wait %[[EXCHANGED]]
// CHECK-NEXT:      %[[A_PEER:[^ ]+]] = hir.alias_select %a[0 = %[[PEER_CHUNK]]]
// CHECK-NEXT:      hir.matmul accumulate ins(%[[A_PEER]], %b : {{.*}}) outs(%[[FOR_PEER]] :
// CHECK-NEXT:      %[[SUM:[^ ]+]] = hir.alias_select %[[FOR_PEER]][0 = %[[C0]]]
// CHECK-NEXT:      %[[OWN_OUT:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[OWN_CHUNK]]]
// CHECK-NEXT:      %[[PEER_OUT:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[PEER_CHUNK]]]
// CHECK-NEXT:      hir.start_coalescing
// CHECK-NEXT:      hir.send %[[SUM]] to %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:      hir.recv %[[OWN_OUT]] from %[[PEER_DEVICE]] backend cuda
// CHECK-NEXT:      %[[SUMMED:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      hir.copy ins(%[[SUM]] : {{.*}}) outs(%[[PEER_OUT]] :
// CHECK-NEXT:      hir.wait %[[SUMMED]]
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.if %[[HAS_LAST]] {
// CHECK-NEXT:      %[[LAST:[^ ]+]] = arith.subi %[[EXTENT]], %[[C1]] : index
// CHECK-NEXT:      %[[A_LAST:[^ ]+]] = hir.alias_select %a[0 = %[[LAST]]]
// CHECK-NEXT:      %[[PARTIAL_LAST:[^ ]+]] = hir.alias_select %[[PARTIAL]][0 = %[[LAST]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_LAST]], %b : {{.*}}) outs(%[[PARTIAL_LAST]] :
// CHECK-NEXT:      %[[OUT_LAST:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[LAST]]]
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.allreduce %[[PARTIAL_LAST]] into %[[OUT_LAST]] team [0, 1] op sum backend cuda
// CHECK-NEXT:      hir.wait %[[W]]
// CHECK-NEXT:    } else {
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

// -----

// A team of devices 3 and 7: the peer device is the other of the two, positions 0 and 1.

!a = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [3, 7], axes = [_, didx, _, _]>
!b = !fusion.tensor<[2, ?, ?], bf16, mesh = [3, 7], axes = [didx, _, _]>
!chunk_a = !fusion.tensor<[2, ?, ?], bf16, mesh = [3, 7], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 2, ?, ?], bf16, mesh = [3, 7], axes = [stream, didx, _, _]>
!out = !fusion.tensor<[?, ?, ?], bf16, mesh = [3, 7], axes = [stream, _, _]>
!chunk_out = !fusion.tensor<[?, ?], bf16, mesh = [3, 7]>

func.func @team_3_7(%a: !a, %b: !b, %out: !out) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %main_stream = hir.get_current_stream
  %num_streams = hir.number_of_streams
  %0 = hir.dim %a, 0 : !a
  %1 = hir.dim %a, 2 : !a
  %2 = hir.dim %b, 2 : !b
  %partial = hir.allocate(%0, %1, %2) symmetric : !partial
  scf.for %i = %c0 to %0 step %c1 {
    %stream_index = arith.remui %i, %num_streams : index
    %stream = hir.stream %stream_index
    hir.set_current_stream %stream
    %a_slice = hir.alias_select %a[0 = %i] : !a -> !chunk_a
    %partial_slice = hir.alias_select %partial[0 = %i] : !partial -> !chunk_a
    hir.matmul ins(%a_slice, %b : !chunk_a, !b) outs(%partial_slice : !chunk_a)
    %out_slice = hir.alias_select %out[0 = %i] : !out -> !chunk_out
    %work = hir.allreduce %partial_slice into %out_slice team [3, 7] op sum backend cuda : !chunk_a, !chunk_out
    hir.wait %work
    hir.set_current_stream %main_stream
    hir.synchronize_stream %stream
  }
  func.return
}

// CHECK-LABEL: func.func @team_3_7(
// CHECK-DAG:     %[[C3:[^ ]+]] = arith.constant 3 : index
// CHECK-DAG:     %[[C7:[^ ]+]] = arith.constant 7 : index
// CHECK:         %[[SECOND:[^ ]+]] = arith.cmpi eq, %{{.*}}, %[[C7]] : index
// CHECK:         %[[PEER_DEVICE:[^ ]+]] = arith.select %[[SECOND]], %[[C3]], %[[C7]] : index
// CHECK:         %[[PAIRS:[^ ]+]] = arith.divui
// CHECK:         scf.for %{{.*}} = %{{.*}} to %[[PAIRS]]
// CHECK:           hir.send %{{.*}} to %[[PEER_DEVICE]] backend cuda
// CHECK:           hir.matmul accumulate
// CHECK:           hir.send %{{.*}} to %[[PEER_DEVICE]] backend cuda
// CHECK:         scf.if
// CHECK:           hir.allreduce {{.*}} team [3, 7]
