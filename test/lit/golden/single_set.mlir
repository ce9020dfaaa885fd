// RUN: hir-opt %S/../../../examples/single_set.mlir -p hir-lowering | filecheck %s
// RUN: hir-opt %S/../../../examples/single_set_non_outermost.mlir -p hir-lowering | filecheck %s --check-prefix=INNER

// pr4147's SingleSetOp: the output is allocated before the loops; a loop makes every
// stream wait for the caller's stream (pr4401), then the work loop copies row i on
// stream i mod number_of_streams and the caller's stream waits for it.

// CHECK-LABEL: func.func @single_set(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK-DAG:     %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-DAG:     %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-DAG:     %[[NS:[^ ]+]] = hir.number_of_streams
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = %[[C0]] to %[[N]] step %[[C1]] {
// CHECK-NEXT:      %[[J:[^ ]+]] = arith.remui %[[I]], %[[NS]] : index
// CHECK-NEXT:      %[[S:[^ ]+]] = hir.stream %[[J]]
// CHECK-NEXT:      hir.set_current_stream %[[S]]
// CHECK-NEXT:      hir.synchronize_stream %[[MAIN]]
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[K:[^ ]+]] = %[[C0]] to %[[N]] step %[[C1]] {
// CHECK-NEXT:      %[[L:[^ ]+]] = arith.remui %[[K]], %[[NS]] : index
// CHECK-NEXT:      %[[T:[^ ]+]] = hir.stream %[[L]]
// CHECK-NEXT:      hir.set_current_stream %[[T]]
// CHECK-NEXT:      %[[IN_K:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[K]]] : !fusion.tensor<[?, ?], f32> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:      %[[OUT_K:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[K]]] : !fusion.tensor<[?, ?], f32, axes = [stream, _]> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:      hir.copy ins(%[[IN_K]] : !fusion.tensor<[?], f32>) outs(%[[OUT_K]] : !fusion.tensor<[?], f32>)
// CHECK-NEXT:      hir.set_current_stream %[[MAIN]]
// CHECK-NEXT:      hir.synchronize_stream %[[T]]
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]

// pr4147's SingleSetOpNonOutermost: the same on axis 1.

// INNER-LABEL: func.func @single_set_non_outermost(
// INNER-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// INNER:         %[[OUT:[^ ]+]] = hir.allocate(%{{[^,]+}}, %[[N:[^,)]+]])
// INNER-NEXT:    scf.for {{.*}} to %[[N]]
// INNER:         scf.for %[[K:[^ ]+]] = {{.*}} to %[[N]]
// INNER:           %[[IN_K:[^ ]+]] = hir.alias_select %[[IN]][1 = %[[K]]]
// INNER-NEXT:      %[[OUT_K:[^ ]+]] = hir.alias_select %[[OUT]][1 = %[[K]]]
// INNER-NEXT:      hir.copy ins(%[[IN_K]] : {{.*}}) outs(%[[OUT_K]] :
