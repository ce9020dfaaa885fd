// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda},copy-engine-pipelining' | filecheck %s
// RUN: hir-opt %s -p 'stream-parallel,copy-engine-pipelining' | filecheck %s --check-prefix=NCCL
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda p2p_order=device},copy-engine-pipelining' | filecheck %s --check-prefix=DEVICE
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda},copy-engine-pipelining' | filecheck %s --check-prefix=IN-PLACE
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda},copy-engine-pipelining' > %t && hir-opt %t -p copy-engine-pipelining | diff %t -

// The point-to-point allgather of a mesh of 4 in ring order, on the copy engines. Its
// iteration 0 copies the own shard (no transfer); iterations 1 to 3 exchange with peers.
// Software-pipelined on the caller's stream: the exchange of iteration 1, then the own
// shard (iteration 0), then iterations 2 and 3 each issue their exchange before waiting
// for the one before; the last wait after the loop.

!in = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!out = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @ring(%x: !in) -> !out {
  %n = hir.dim %x, 1 : !in
  %y = hir.allocate(%n) : !out
  %w = hir.allgather %x into %y team [0, 1, 2, 3] backend nccl : !in, !out
  hir.wait %w
  func.return %y : !out
}

// CHECK-LABEL: func.func @ring(
// CHECK-NOT:     hir.set_current_stream
// CHECK:         %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK:         %[[C2:[^ ]+]] = arith.constant 2 : index
// CHECK:         hir.start_coalescing
// CHECK-NEXT:    hir.recv {{.*}} backend cuda
// CHECK-NEXT:    hir.send {{.*}} backend cuda
// CHECK-NEXT:    %[[W1:[^ ]+]] = hir.end_coalescing
// CHECK-NOT:     hir.wait
// CHECK:         hir.copy
// CHECK-NEXT:    %[[LAST:[^ ]+]] = scf.for %[[I:[^ ]+]] = %[[C2]] to %{{.*}} step %[[C1]] iter_args(%[[PREVIOUS:[^ ]+]] = %[[W1]]) -> (!hir.work) {
// CHECK:           hir.recv {{.*}} backend cuda
// CHECK-NEXT:      hir.send {{.*}} backend cuda
// CHECK-NEXT:      %[[W:[^ ]+]] = hir.end_coalescing
// CHECK-NEXT:      hir.wait %[[PREVIOUS]]
// CHECK-NEXT:      scf.yield %[[W]] : !hir.work
// CHECK-NEXT:    }
// CHECK:         hir.wait %[[LAST]]
// CHECK-NEXT:    func.return

// On NCCL, and in pr4515's device order (whose own shard is at iteration `rank`, not
// 0), the ring stays on the pool streams.

// NCCL-LABEL: func.func @ring(
// NCCL-NOT:     iter_args
// NCCL:         hir.set_current_stream
// NCCL:         hir.recv {{.*}} backend nccl

// DEVICE-LABEL: func.func @ring(
// DEVICE-NOT:     iter_args
// DEVICE:         hir.set_current_stream
// DEVICE:         hir.recv {{.*}} backend cuda

// The ring of an AG+GEMM, whose gathered buffer only the GEMMs read: the peeled own-shard
// iteration's GEMM reads the shard in place, with no copy of it into its slot.

!a = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!g = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>

func.func @ring_matmul(%a: !a, %b: !b) -> !g {
  %m = hir.dim %a, 1 : !a
  %k = hir.dim %a, 2 : !a
  %g = hir.allocate(%m, %k) : !g
  %w = hir.allgather %a into %g team [0, 1, 2, 3] backend nccl : !a, !g
  hir.wait %w
  %n = hir.dim %b, 1 : !b
  %c = hir.allocate(%m, %n) : !g
  hir.matmul ins(%g, %b : !g, !b) outs(%c : !g)
  func.return %c : !g
}

// IN-PLACE-LABEL: func.func @ring_matmul(
// IN-PLACE:         %[[SENT:[^ ]+]] = hir.allocate({{.*}}) symmetric
// IN-PLACE-NEXT:    hir.copy ins(%a :
// IN-PLACE:         hir.end_coalescing
// IN-PLACE-NOT:     hir.copy
// IN-PLACE:         %[[OWN:[^ ]+]] = hir.alias_select %[[SENT]][0 = %{{.*}}]
// IN-PLACE-NOT:     hir.copy
// IN-PLACE:         hir.matmul ins(%[[OWN]], %b :
// IN-PLACE:         scf.for
// IN-PLACE-NOT:     hir.copy
// IN-PLACE:         func.return
