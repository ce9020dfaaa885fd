// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// nvFuser's TwoSetOps: consecutive stream-parallel ops over the same extent share
// one loop (and one synchronisation loop). The allocation between them moves before
// the loops, and the second copy reads the slice the first one wrote.

!t = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @two_sets(%t0: !t) -> !s {
  %d0 = hir.dim %t0, 0 : !t
  %d1 = hir.dim %t0, 1 : !t
  %t1 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t0 : !t) outs(%t1 : !s)
  %e0 = hir.dim %t1, 0 : !s
  %e1 = hir.dim %t1, 1 : !s
  %t2 = hir.allocate(%e0, %e1) : !s
  hir.copy ins(%t1 : !s) outs(%t2 : !s)
  func.return %t2 : !s
}

// CHECK-LABEL: func.func @two_sets(
// CHECK-SAME:      %[[T0:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[T1]], 0
// CHECK-NEXT:    hir.dim %[[T1]], 0
// CHECK-NEXT:    hir.dim %[[T1]], 1
// CHECK-NEXT:    %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for %{{.*}} to %[[N]]
// CHECK-NOT:       hir.copy
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N]]
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[T0_I:[^ ]+]] = hir.alias_select %[[T0]][0 = %[[I]]]
// CHECK-NEXT:      %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T0_I]] : {{.*}}) outs(%[[T1_I]] :
// CHECK-NEXT:      %[[T2_I:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T1_I]] : {{.*}}) outs(%[[T2_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[T2]]

// nvFuser's ThreeSetOpsWithDisjointsForLoops: the middle copy is not
// stream-parallel, so it ends the first loop and a second one starts after it.

func.func @three_sets(%t0: !t) -> !s {
  %d0 = hir.dim %t0, 0 : !t
  %d1 = hir.dim %t0, 1 : !t
  %t1 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t0 : !t) outs(%t1 : !s)
  %t2 = hir.allocate(%d0, %d1) : !t
  hir.copy ins(%t1 : !s) outs(%t2 : !t)
  %t3 = hir.allocate(%d0, %d1) : !s
  hir.copy ins(%t2 : !t) outs(%t3 : !s)
  func.return %t3 : !s
}

// CHECK-LABEL: func.func @three_sets(
// CHECK-SAME:      %[[T0:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N1:[^ ]+]] = hir.dim %[[T1]], 0
// CHECK-NEXT:    scf.for %{{.*}} to %[[N1]]
// CHECK:         scf.for %[[I:[^ ]+]] = %{{.*}} to %[[N1]]
// CHECK:           %[[T0_I:[^ ]+]] = hir.alias_select %[[T0]][0 = %[[I]]]
// CHECK-NEXT:      %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T0_I]] : {{.*}}) outs(%[[T1_I]] :
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    hir.copy ins(%[[T1]] : {{.*}}) outs(%[[T2]] :
// CHECK-NEXT:    %[[T3:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N3:[^ ]+]] = hir.dim %[[T3]], 0
// CHECK-NEXT:    scf.for %{{.*}} to %[[N3]]
// CHECK:         scf.for %[[K:[^ ]+]] = %{{.*}} to %[[N3]]
// CHECK:           %[[T2_K:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[K]]]
// CHECK-NEXT:      %[[T3_K:[^ ]+]] = hir.alias_select %[[T3]][0 = %[[K]]]
// CHECK-NEXT:      hir.copy ins(%[[T2_K]] : {{.*}}) outs(%[[T3_K]] :
// CHECK:         }
// CHECK-NEXT:    func.return %[[T3]]

// Loops over extents that may differ stay apart, each with its own synchronisation loop.

func.func @different_extents(%a: !t, %b: !t) -> (!s, !s) {
  %m = hir.dim %a, 0 : !t
  %n = hir.dim %a, 1 : !t
  %x = hir.allocate(%m, %n) : !s
  hir.copy ins(%a : !t) outs(%x : !s)
  %p = hir.dim %b, 0 : !t
  %q = hir.dim %b, 1 : !t
  %y = hir.allocate(%p, %q) : !s
  hir.copy ins(%b : !t) outs(%y : !s)
  func.return %x, %y : !s, !s
}

// CHECK-LABEL: func.func @different_extents(
// CHECK-COUNT-4: scf.for
// CHECK-NOT:     scf.for
// CHECK:         func.return

// Static extents are compared by value: two loops over 4 merge.

!a4 = !fusion.tensor<[4, 8], f32>
!s4 = !fusion.tensor<[4, 8], f32, axes = [stream, _]>

func.func @static_extents(%a: !a4) -> !s4 {
  %x = hir.allocate() : !s4
  hir.pointwise "neg" ins(%a : !a4) outs(%x : !s4)
  %y = hir.allocate() : !s4
  hir.pointwise "exp" ins(%x : !s4) outs(%y : !s4)
  func.return %y : !s4
}

// CHECK-LABEL: func.func @static_extents(
// CHECK-COUNT-2: scf.for
// CHECK-NOT:     scf.for
// CHECK:         func.return

// A data-movement segment between the loops (a weight's broadcast, written between the
// two ops it separates) that neither loop's buffers meet moves before the loops, which
// merge; one that reads what the first loop wrote stays between them, and so do the loops.

!w = !fusion.tensor<[8], f32>
!wb = !fusion.tensor<[1, 8], f32>

func.func private @broadcast_row(%v: !w) -> !wb {
  %r = fusion.broadcast %v [0] : !w -> !wb
  func.return %r : !wb
}

func.func private @copied(%v: !s4) -> !a4 {
  %r = fusion.set %v : !s4 -> !a4
  func.return %r : !a4
}

func.func @independent_broadcast(%a: !a4, %w: !w) -> !s4 {
  %x = hir.allocate() : !s4
  hir.pointwise "neg" ins(%a : !a4) outs(%x : !s4)
  %wb = hir.allocate() : !wb
  hir.post_on_stream @broadcast_row ins(%w : !w) outs(%wb : !wb)
  %y = hir.allocate() : !s4
  hir.pointwise "add" ins(%x, %wb : !s4, !wb) outs(%y : !s4)
  func.return %y : !s4
}

// CHECK-LABEL: func.func @independent_broadcast(
// CHECK:         %wb = hir.allocate
// CHECK-NEXT:    hir.post_on_stream @broadcast_row ins(%w : {{.*}}) outs(%wb :
// CHECK-COUNT-2: scf.for
// CHECK-NOT:     scf.for
// CHECK:         func.return

func.func @dependent_segment(%a: !a4) -> !s4 {
  %x = hir.allocate() : !s4
  hir.pointwise "neg" ins(%a : !a4) outs(%x : !s4)
  %copy = hir.allocate() : !a4
  hir.post_on_stream @copied ins(%x : !s4) outs(%copy : !a4)
  %y = hir.allocate() : !s4
  hir.pointwise "exp" ins(%copy : !a4) outs(%y : !s4)
  func.return %y : !s4
}

// CHECK-LABEL: func.func @dependent_segment(
// CHECK-COUNT-2: scf.for
// CHECK:         hir.post_on_stream @copied
// CHECK-COUNT-2: scf.for
// CHECK-NOT:     scf.for
// CHECK:         func.return
