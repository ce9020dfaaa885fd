// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{p2p_backend=cuda}' | filecheck %s --check-prefixes=CHECK,CUDA

// pr4515's AllgatherP2p on a mesh of 8: [DIDx(8), M] -> [Stream(8), M]. Iteration i
// fills row i with the shard of device i: device i copies its own shard; every other
// device receives it and, in the same coalesced batch, sends its own shard to device
// i, then waits for the batch. p2p_backend picks who moves the bytes; with the copy
// engines (cuda) peers read the shard, so it is first copied into a symmetric buffer.

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
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[8, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _]>
// CUDA-NEXT:     hir.copy ins(%[[IN]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]] : {{.*}} -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[OUT_I]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[OUT_I]] from %[[I]] backend nccl
// NCCL-NEXT:         hir.send %[[IN]] to %[[I]] backend nccl
// CUDA-NEXT:         hir.recv %[[OUT_I]] from %[[I]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[I]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CHECK-NEXT:    func.return %[[OUT]]
