// RUN: hir-opt %S/../../../examples/two_sets.mlir -p hir-lowering | filecheck %s

// pr4147's TwoSetOps: both copies run in one loop, the second reading the slice the
// first wrote; both buffers are allocated before the loops and the intermediate is
// freed after them.

// CHECK-LABEL: func.func @two_sets(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// CHECK:         %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] =
// CHECK-NEXT:      arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]]
// CHECK-NEXT:      %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[IN_I]] : {{.*}}) outs(%[[T1_I]] :
// CHECK-NEXT:      %[[T2_I:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T1_I]] : {{.*}}) outs(%[[T2_I]] :
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[T1]]
// CHECK-NEXT:    func.return %[[T2]]
