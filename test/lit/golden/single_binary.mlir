// RUN: hir-opt %S/../../../examples/single_binary.mlir -p hir-lowering | filecheck %s

// pr4147's SingleBinaryOp: the addition is a fused kernel; its launch runs on slices,
// through a copy of the segment whose values lost the stream axis (nvFuser refuses
// stream-parallel kernels). The unsliced segment is gone.

// CHECK-NOT:   func.func private @single_binary_segment_0(
// CHECK-LABEL: func.func private @single_binary_segment_0_slice(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[?], f32>, %[[Y:[^:]+]]: !fusion.tensor<[?], f32>) -> !fusion.tensor<[?], f32> {
// CHECK-NEXT:    %[[Z:[^ ]+]] = fusion.add %[[X]], %[[Y]] : (!fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) -> !fusion.tensor<[?], f32>
// CHECK-NEXT:    func.return %[[Z]]
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @single_binary(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate(%[[N:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N]]
// CHECK:         scf.for %[[I:[^ ]+]] = {{.*}} to %[[N]]
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[B_I:[^ ]+]] = hir.alias_select %[[B]][0 = %[[I]]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.launch_kernel @single_binary_segment_0_slice ins(%[[A_I]], %[[B_I]] : {{.*}}) outs(%[[OUT_I]] : !fusion.tensor<[?], f32>)
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
