// RUN: hir-opt %S/../../../examples/reduction.mlir -p hir-lowering | filecheck %s

// pr4147's Reduction: each iteration sums one [i1, i2] slice over its axis 1 (axis 2
// of the whole input).

// CHECK-LABEL: func.func @reduction(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : !fusion.tensor<[?, ?, ?], f32> -> !fusion.tensor<[?, ?], f32>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]] : !fusion.tensor<[?, ?], f32, axes = [stream, _]> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:      hir.reduction "sum" [1] ins(%[[IN_I]] : !fusion.tensor<[?, ?], f32>) outs(%[[OUT_I]] : !fusion.tensor<[?], f32>)
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
