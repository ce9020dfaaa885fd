// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p 'stream-parallel{p2p_order=device}' | filecheck %s --check-prefix=DEVICE
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// Merging loops around a ring point-to-point allgather. An iteration of the ring works
// on its slot (p + i) mod D, not on slot i: a plain loop after it merges into it with
// the slot for its induction variable; a ring loop merges into a previous loop only if
// that one visits the slots in the same order (a ring over the same mesh, whose slot it
// then shares), never into a plain loop, whose iteration i works on slot i.

!x = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]>
!xs = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>
!in = !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!hin = !fusion.tensor<[4, ?], f32, mesh = [4, 5, 6, 7], axes = [didx, _]>
!hout = !fusion.tensor<[4, ?], f32, mesh = [4, 5, 6, 7], axes = [stream, _]>

// A plain loop, then a ring over the same extent: two loops. The sum after the ring
// merges into it, at the slot.

func.func @plain_then_ring(%x: !x, %a: !in) -> !xs {
  %m = hir.dim %x, 1 : !x
  %y = hir.allocate(%m) : !xs
  hir.copy ins(%x : !x) outs(%y : !xs)
  %g = hir.allocate(%m) : !xs
  %w = hir.allgather %a into %g team [0, 1, 2, 3] backend nccl : !in, !xs
  hir.wait %w
  %z = hir.allocate(%m) : !xs
  hir.pointwise "add" ins(%y, %g : !xs, !xs) outs(%z : !xs)
  func.return %z : !xs
}

// CHECK-LABEL: func.func @plain_then_ring(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[4, ?], f32, mesh = [0, 1, 2, 3]>,
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] =
// CHECK:           %[[X_I:[^ ]+]] = hir.alias_select %[[X]][0 = %[[I]]]
// CHECK-NEXT:      %[[Y_I:[^ ]+]] = hir.alias_select %[[Y]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[X_I]] : {{.*}}) outs(%[[Y_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[G:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[J:[^ ]+]] =
// CHECK:           %[[SLOT:slot]] = arith.remui
// CHECK-NEXT:      %[[G_S:[^ ]+]] = hir.alias_select %[[G]][0 = %[[SLOT]]]
// CHECK:             hir.recv %[[G_S]] from %[[SLOT]]
// CHECK:           }
// CHECK-NEXT:      %[[Y_S:[^ ]+]] = hir.alias_select %[[Y]][0 = %[[SLOT]]]
// CHECK-NEXT:      %[[Z_S:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[SLOT]]]
// CHECK-NEXT:      hir.pointwise "add" ins(%[[Y_S]], %[[G_S]] : {{.*}}) outs(%[[Z_S]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

// In device order (pr4515) iteration i works on slot i everywhere: one loop.

// DEVICE-LABEL: func.func @plain_then_ring(
// DEVICE:         scf.for
// DEVICE:         scf.for %[[I:[^ ]+]] =
// DEVICE:           hir.copy
// DEVICE:           hir.recv %{{.*}} from %[[I]]
// DEVICE:           hir.pointwise "add"
// DEVICE:         }
// DEVICE-NOT:     scf.for
// DEVICE:         func.return

// Two rings over the same mesh: one loop, in which the second ring and the sum use the
// first ring's slot.

func.func @ring_then_ring(%a: !in, %b: !in) -> !xs {
  %m = hir.dim %a, 1 : !in
  %g = hir.allocate(%m) : !xs
  %w = hir.allgather %a into %g team [0, 1, 2, 3] backend nccl : !in, !xs
  hir.wait %w
  %h = hir.allocate(%m) : !xs
  %v = hir.allgather %b into %h team [0, 1, 2, 3] backend nccl : !in, !xs
  hir.wait %v
  %z = hir.allocate(%m) : !xs
  hir.pointwise "add" ins(%g, %h : !xs, !xs) outs(%z : !xs)
  func.return %z : !xs
}

// CHECK-LABEL: func.func @ring_then_ring(
// CHECK:         scf.for
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] =
// CHECK:           %[[SLOT:slot]] = arith.remui
// CHECK-NEXT:      %[[G_S:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[SLOT]]]
// CHECK:             hir.recv %[[G_S]] from %[[SLOT]]
// CHECK:           }
// CHECK-NEXT:      %[[H_S:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[SLOT]]]
// CHECK-NEXT:      arith.cmpi eq, %[[I]]
// CHECK-NEXT:      scf.if
// CHECK:             hir.recv %[[H_S]] from %[[SLOT]]
// CHECK:           }
// CHECK-NEXT:      %[[Z_S:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[SLOT]]]
// CHECK-NEXT:      hir.pointwise "add" ins(%[[G_S]], %[[H_S]] : {{.*}}) outs(%[[Z_S]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

// Rings over two meshes of 4: the slots of an iteration differ (position rank vs
// rank - 4), so two loops.

func.func @rings_of_two_meshes(%a: !in, %b: !hin) -> (!xs, !hout) {
  %m = hir.dim %a, 1 : !in
  %g = hir.allocate(%m) : !xs
  %w = hir.allgather %a into %g team [0, 1, 2, 3] backend nccl : !in, !xs
  hir.wait %w
  %n = hir.dim %b, 1 : !hin
  %h = hir.allocate(%n) : !hout
  %v = hir.allgather %b into %h team [4, 5, 6, 7] backend nccl : !hin, !hout
  hir.wait %v
  func.return %g, %h : !xs, !hout
}

// CHECK-LABEL: func.func @rings_of_two_meshes(
// CHECK-COUNT-4: scf.for
// CHECK-NOT:     scf.for
// CHECK:         func.return
