// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{p2p_backend=cuda}' | filecheck %s --check-prefixes=CHECK,CUDA

// pr4515's AG_matmul_P2p on a mesh of 8: A [DIDx(8), M, K] @ B [K, N] -> [Stream(8), M, N].
// insert-reshardings gathers A into a stream-parallel buffer, which is the
// point-to-point allgather; the matmul of row i runs in the same iteration, and the
// gathered buffer is freed after the loop. With the copy engines (cuda) peers read
// the shard of A, so it is first copied into a symmetric buffer.

!a = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>

func.func @ag_matmul_p2p(%a: !a, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_matmul_p2p(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK:         %[[G:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CUDA-NEXT:     hir.copy ins(%[[A]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[G]], 0
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]]
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[A]][0 = %{{.*}}]
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %{{.*}}]
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[G_I]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[G_I]] from %[[I]] backend nccl
// NCCL-NEXT:         hir.send %[[A]] to %[[I]] backend nccl
// CUDA-NEXT:         hir.recv %[[G_I]] from %[[I]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[I]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_I]], %[[B]] : {{.*}}) outs(%[[OUT_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CHECK-NEXT:    hir.deallocate %[[G]]
// CHECK-NEXT:    func.return %[[OUT]]
