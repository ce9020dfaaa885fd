// RUN: hir-opt %S/../../../examples/two_sets.mlir -p hir-lowering | filecheck %s --check-prefixes=CHECK,PER
// RUN: hir-opt %S/../../../examples/two_sets.mlir -p 'hir-lowering{per_stream_buffers=false}' | filecheck %s --check-prefixes=CHECK,REF

// pr4147's TwoSetOps: both copies run in one loop, the second reading the slice the
// first wrote; both buffers are allocated before the loops and the intermediate is
// freed after them. The intermediate has one slice per stream, iteration i using
// slice i mod number_of_streams: the optimisation pr4147 names ("the allocation of the
// intermediate buffer could be only of length numberOfStreams"); without
// per-stream-buffers it has one slice per iteration, as in pr4147.

// CHECK-LABEL: func.func @two_sets(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[MAIN:[^ ]+]] = hir.get_current_stream
// PER:           %[[SLOTS:[^ ]+]] = arith.minui
// CHECK:         %[[T1:[^ ]+]] = hir.allocate
// PER-SAME:        (%[[SLOTS]],
// CHECK:         %[[T2:[^ ]+]] = hir.allocate
// CHECK-NEXT:    scf.for
// CHECK-NEXT:      arith.remui
// CHECK-NEXT:      hir.stream
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] =
// CHECK-NEXT:      %[[SI:[^ ]+]] = arith.remui %[[I]]
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]]
// REF-NEXT:        %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// PER-NEXT:        %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[SI]]]
// CHECK-NEXT:      hir.copy ins(%[[IN_I]] : {{.*}}) outs(%[[T1_I]] :
// CHECK-NEXT:      %[[T2_I:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[T1_I]] : {{.*}}) outs(%[[T2_I]] :
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[S]]
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[T1]]
// CHECK-NEXT:    func.return %[[T2]]
