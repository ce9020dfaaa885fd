// RUN: hir-opt %s -p 'hir-lowering{per_stream_buffers=false}' | filecheck %s --check-prefixes=CHECK,NCCL
// RUN: hir-opt %s -p 'hir-lowering{p2p_backend=cuda per_stream_buffers=false copy_engine_pipelining=false}' | filecheck %s --check-prefixes=CHECK,CUDA
// RUN: hir-opt %s -p 'hir-lowering{p2p_order=device per_stream_buffers=false}' | filecheck %s --check-prefix=DEVICE
// RUN: hir-opt %s -p hir-lowering | filecheck %s --check-prefix=PER
// RUN: hir-opt %s -p 'hir-lowering{p2p_backend=cuda}' | filecheck %s --check-prefix=PIPE

// pr4515's AG_matmul_P2p on a mesh of 8: A [DIDx(8), M, K] @ B [K, N] -> [Stream(8), M, N].
// insert-reshardings gathers A into a stream-parallel buffer, which is the
// point-to-point allgather, in ring order: iteration i of device p receives slot
// s = (p + i) mod 8 (or copies its own shard, at i == 0). The matmul merged into the
// loop computes the same slot s of the product, from the slice that has just arrived,
// and the gathered buffer is freed after the loop. With the copy engines (cuda) peers
// read the shard of A, so it is first copied into a symmetric buffer.

!a = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>
!out = !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>

func.func @ag_matmul_p2p(%a: !a, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}

// CHECK-LABEL: func.func @ag_matmul_p2p(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// CHECK-DAG:     %[[C8:[^ ]+]] = arith.constant 8 : index
// CHECK:         %[[G:[^ ]+]] = hir.allocate({{.*}}) : !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [stream, _, _]>
// CUDA-NEXT:     %[[STAGED:[^ ]+]] = hir.allocate({{.*}}) symmetric : !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>
// CUDA-NEXT:     hir.copy ins(%[[A]] : {{.*}}) outs(%[[STAGED]] :
// CHECK-NEXT:    %[[WRAPPED:[^ ]+]] = arith.addi %[[RANK]], %[[C8]] : index
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for {{.*}} to %[[C8]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[C8]]
// CHECK:           %[[AHEAD:[^ ]+]] = arith.addi %[[RANK]], %[[I]] : index
// CHECK-NEXT:      %[[SLOT:[^ ]+]] = arith.remui %[[AHEAD]], %[[C8]] : index
// CHECK-NEXT:      %[[G_S:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SLOT]]]
// CHECK-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[C0]] : index
// CHECK-NEXT:      scf.if %[[OWN]] {
// NCCL-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[A]][0 = %[[C0]]]
// CUDA-NEXT:         %[[SHARD:[^ ]+]] = hir.alias_select %[[STAGED]][0 = %[[C0]]]
// CHECK-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[G_S]] :
// CHECK-NEXT:      } else {
// CHECK-NEXT:        %[[BEHIND:[^ ]+]] = arith.subi %[[WRAPPED]], %[[I]] : index
// CHECK-NEXT:        %[[SEND_PEER:[^ ]+]] = arith.remui %[[BEHIND]], %[[C8]] : index
// CHECK-NEXT:        hir.start_coalescing
// NCCL-NEXT:         hir.recv %[[G_S]] from %[[SLOT]] backend nccl
// NCCL-NEXT:         hir.send %[[A]] to %[[SEND_PEER]] backend nccl
// CUDA-NEXT:         hir.recv %[[G_S]] from %[[SLOT]] backend cuda
// CUDA-NEXT:         hir.send %[[STAGED]] to %[[SEND_PEER]] backend cuda
// CHECK-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:        hir.wait %[[BATCH]]
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[OUT_S:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[SLOT]]]
// CHECK-NEXT:      hir.matmul ins(%[[G_S]], %[[B]] : {{.*}}) outs(%[[OUT_S]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CUDA-NEXT:     hir.deallocate %[[STAGED]]
// CHECK-NEXT:    hir.deallocate %[[G]]
// CHECK-NEXT:    func.return %[[OUT]]

// p2p_order=device is pr4515's program: iteration i gathers row i from device i and
// multiplies it.

// DEVICE-LABEL: func.func @ag_matmul_p2p(
// DEVICE-SAME:      %[[A:[^:]+]]: !fusion.tensor<[8, ?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7], axes = [didx, _, _]>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3, 4, 5, 6, 7]>)
// DEVICE-DAG:     %[[RANK:[^ ]+]] = hir.device_index
// DEVICE:         %[[G:[^ ]+]] = hir.allocate
// DEVICE-NEXT:    %[[C8:[^ ]+]] = arith.constant 8 : index
// DEVICE-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// DEVICE-NEXT:    scf.for {{.*}} to %[[C8]]
// DEVICE:           hir.synchronize_stream
// DEVICE-NEXT:    }
// DEVICE-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[C8]]
// DEVICE-NEXT:      arith.remui %[[I]]
// DEVICE-NEXT:      hir.stream
// DEVICE-NEXT:      hir.set_current_stream
// DEVICE-NEXT:      %[[G_I:[^ ]+]] = hir.alias_select %[[G]][0 = %[[I]]]
// DEVICE-NEXT:      %[[OWN:[^ ]+]] = arith.cmpi eq, %[[I]], %[[RANK]] : index
// DEVICE-NEXT:      scf.if %[[OWN]] {
// DEVICE-NEXT:        %[[SHARD:[^ ]+]] = hir.alias_select %[[A]][0 = %{{.*}}]
// DEVICE-NEXT:        hir.copy ins(%[[SHARD]] : {{.*}}) outs(%[[G_I]] :
// DEVICE-NEXT:      } else {
// DEVICE-NEXT:        hir.start_coalescing
// DEVICE-NEXT:        hir.recv %[[G_I]] from %[[I]] backend nccl
// DEVICE-NEXT:        hir.send %[[A]] to %[[I]] backend nccl
// DEVICE-NEXT:        %[[BATCH:[^ ]+]] = hir.end_coalescing
// DEVICE-NEXT:        hir.wait %[[BATCH]]
// DEVICE-NEXT:      }
// DEVICE-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// DEVICE-NEXT:      hir.matmul ins(%[[G_I]], %[[B]] : {{.*}}) outs(%[[OUT_I]] :
// DEVICE-NEXT:      hir.set_current_stream
// DEVICE-NEXT:      hir.synchronize_stream
// DEVICE-NEXT:    }
// DEVICE-NEXT:    hir.deallocate %[[G]]
// DEVICE-NEXT:    func.return %[[OUT]]

// The default pipeline gives the received shards one slice per stream (per-stream-buffers,
// pr4147's suggested optimisation): iteration i uses slice i mod number_of_streams.

// PER-LABEL: func.func @ag_matmul_p2p(
// PER:         %[[SLOTS:[^ ]+]] = arith.minui %{{[^ ]+}}, %{{[^ ]+}} : index
// PER-NEXT:    %[[BUF:[^ ]+]] = hir.allocate(%[[SLOTS]],
// PER:         scf.for
// PER:         scf.for
// PER-NEXT:      %[[SI:[^ ]+]] = arith.remui
// PER:           %[[SLOT:[^ ]+]] = arith.remui
// PER-NEXT:      %[[BUF_I:[^ ]+]] = hir.alias_select %[[BUF]][0 = %[[SI]]]
// PER:           hir.recv %[[BUF_I]] from %[[SLOT]]
// PER:           hir.alias_select %{{[^ ]+}}[0 = %[[SLOT]]]
// PER-NEXT:      hir.matmul ins(%[[BUF_I]],

// With the copy engines the default pipeline also runs copy-engine-pipelining: the ring
// runs on the caller's stream, the exchange of iteration 1 first, then the own shard's
// matmul (iteration 0, while the exchange is in flight), then iteration i issues its
// exchange before waiting for that of i - 1 and running its matmul. The gathered
// buffer is only the matmuls' operand, so the own shard's matmul reads the symmetric
// copy of A in place instead of a copy of it in its slot.

// PIPE-LABEL: func.func @ag_matmul_p2p(
// PIPE-NOT:     hir.set_current_stream
// PIPE-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// PIPE-DAG:     %[[C2:[^ ]+]] = arith.constant 2 : index
// PIPE:         %[[SYM:[^ ]+]] = hir.allocate({{.*}}) symmetric
// PIPE:         hir.start_coalescing
// PIPE-NEXT:    hir.recv %{{.*}} from %{{.*}} backend cuda
// PIPE-NEXT:    hir.send %[[SYM]] to %{{.*}} backend cuda
// PIPE-NEXT:    %[[W1:[^ ]+]] = hir.end_coalescing
// PIPE-NOT:     hir.copy
// PIPE:         %[[OWN:[^ ]+]] = hir.alias_select %[[SYM]][0 = %{{.*}}]
// PIPE-NOT:     hir.copy
// PIPE:         hir.matmul ins(%[[OWN]], {{.*}})
// PIPE-NEXT:    %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %[[C2]] to %{{.*}} step %[[C1]] iter_args(%[[PREVIOUS:[^ ]+]] = %[[W1]]) -> (!hir.work) {
// PIPE:           hir.start_coalescing
// PIPE:           %[[W:[^ ]+]] = hir.end_coalescing
// PIPE-NEXT:      %[[BEFORE:[^ ]+]] = arith.subi %[[I]], %[[C1]] : index
// PIPE:           hir.wait %[[PREVIOUS]]
// PIPE:           hir.matmul
// PIPE-NEXT:      scf.yield %[[W]] : !hir.work
// PIPE-NEXT:    }
// PIPE:         hir.wait %[[LAST]]
// PIPE:         hir.matmul
