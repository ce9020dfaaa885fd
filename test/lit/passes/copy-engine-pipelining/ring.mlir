// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda},copy-engine-pipelining' | filecheck %s
// RUN: hir-opt %s -p 'stream-parallel,copy-engine-pipelining' | filecheck %s --check-prefix=NCCL
// RUN: hir-opt %s -p 'stream-parallel{p2p_backend=cuda p2p_order=device},copy-engine-pipelining' | filecheck %s --check-prefix=DEVICE

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
