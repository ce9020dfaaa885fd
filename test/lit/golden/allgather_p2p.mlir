// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{p2p_backend=cuda copy_engine_pipelining=false}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'hir-lowering{p2p_order=device}' | filecheck %s --check-prefix=DEVICE

// pr4515's AllgatherP2p on a mesh of 8: [DIDx(8), M] -> [Stream(8), M], in ring order.
// Device p (its position in the mesh; the mesh starts at 0) works on slot
// s = (p + i) mod 8 in iteration i: at i == 0 it copies its own shard there; otherwise,
// in one coalesced batch, it receives slot s from device s and sends its own shard to
// device (p + 8 - i) mod 8, whose slot in iteration i is p, then waits for the batch.
// At every step each device sends to one peer and receives from another: every link is
// busy. p2p_backend picks who moves the bytes; with the copy engines (cuda) peers read
// the shard, so it is first copied into a symmetric buffer.

!in = !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
!out = !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _]>

func.func @allgather_p2p(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @allgather_p2p(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>)
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK-DAG:     %[[C8:[^ ]+]] = arith.constant 8 : index
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[WRAPPED:[^ ]+]] = arith.addi %[[RANK]], %[[C8]] : index
// CHECK-NEXT:    scf.for {{.*}} to %[[C8]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[C8]]
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[AHEAD:[^ ]+]] = arith.addi %[[RANK]], %[[I]] : index
// CHECK-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[AHEAD]], %[[C8]] : index
// CHECK-NEXT:      %[[OUT_S:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[SLOT]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_S]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        %[[BEHIND:[^ ]+]] = arith.subi %[[WRAPPED]], %[[I]] : index
// CHECK-NEXT:        %[[SEND_PEER:[^ ]+]] = arith.remui %[[BEHIND]], %[[C8]] : index
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[OUT_S]] from %[[SLOT]] backend nccl
// NCCL-NEXT:         hir.send %[[IN]] to %[[SEND_PEER]] backend nccl
// CUDA-NEXT:         hir.recv %[[OUT_S]] from %[[SLOT]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[SEND_PEER]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CHECK-NEXT:    func.return %[[OUT]]

// p2p_order=device is pr4515's program exactly: iteration i fills row i with the shard
// of device i; device i copies its own shard, every other device receives it and, in
// the same batch, sends its own shard to device i.

// DEVICE-LABEL: func.func @allgather_p2p(
// DEVICE-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>)
// DEVICE-NEXT:    %[[C0:[^ ]+]] = arith.constant 0 : index
// DEVICE-NEXT:    %[[C1:[^ ]+]] = arith.constant 1 : index
// DEVICE-NEXT:    %[[MAIN:[^ ]+]] = hir.get_current_stream
// DEVICE-NEXT:    %[[STREAMS:[^ ]+]] = hir.number_of_streams
// DEVICE-NEXT:    %[[RANK:[^ ]+]] = hir.device_index
// DEVICE-NEXT:    %[[M:[^ ]+]] = hir.dim %[[IN]], 1
// DEVICE-NEXT:    %[[OUT:[^ ]+]] = hir.allocate(%[[M]])
// DEVICE-NEXT:    %[[C8:[^ ]+]] = arith.constant 8 : index
// DEVICE-NEXT:    scf.for %[[J:[^ ]+]] = %[[C0]] to %[[C8]] step %[[C1]] {
// DEVICE-NEXT:      %[[JS:[^ ]+]] = arith.remui %[[J]], %[[STREAMS]] : index
// DEVICE-NEXT:      %[[SJ:[^ ]+]] = hir.stream %[[JS]]
// DEVICE-NEXT:      hir.set_current_stream %[[SJ]]
// DEVICE-NEXT:      hir.synchronize_stream %[[MAIN]]
// DEVICE-NEXT:    }
// DEVICE-NEXT:    scf.for %[[I:[^ ]+]] = %[[C0]] to %[[C8]] step %[[C1]] {
// DEVICE-NEXT:      %[[IS:[^ ]+]] = arith.remui %[[I]], %[[STREAMS]] : index
// DEVICE-NEXT:      %[[S:[^ ]+]] = hir.stream %[[IS]]
// DEVICE-NEXT:      hir.set_current_stream %[[S]]
// DEVICE-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// DEVICE-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// DEVICE-NEXT:      scf.if %[[OWN]] {
// DEVICE-NEXT:        %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// DEVICE-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_I]] :
// DEVICE-NEXT:      } else {
// DEVICE-NEXT:        hir.start_coalescing
// DEVICE-NEXT:        hir.recv %[[OUT_I]] from %[[I]] backend nccl
// DEVICE-NEXT:        hir.send %[[IN]] to %[[I]] backend nccl
// DEVICE-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// DEVICE-NEXT:        hir.wait %[[BATCH]]
// DEVICE-NEXT:      }
// DEVICE-NEXT:      hir.set_current_stream %[[MAIN]]
// DEVICE-NEXT:      hir.synchronize_stream %[[S]]
// DEVICE-NEXT:    }
// DEVICE-NEXT:    func.return %[[OUT]]
