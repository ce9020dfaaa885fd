// RUN: hir-opt %S/../../../examples/linear.mlir -p hir-lowering | filecheck %s

// A linear with a bias, stream-parallel on a batch axis: weight and bias go whole
// into every iteration.

// CHECK-LABEL: func.func @linear(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>, %[[W:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?], f32>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.linear ins(%[[IN_I]], %[[W]], %[[B]] : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) outs(%[[OUT_I]] : !fusion.tensor<[?, ?], f32>)
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
