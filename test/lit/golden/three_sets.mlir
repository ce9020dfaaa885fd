// RUN: hir-opt %S/../../../examples/three_sets.mlir -p hir-lowering | filecheck %s --check-prefixes=CHECK,FWD
// RUN: hir-opt %S/../../../examples/three_sets.mlir -p 'hir-lowering{forward_buffers=false}' | filecheck %s --check-prefixes=CHECK,REF

// pr4147's ThreeSetOpsWithDisjointsForLoops: the middle copy is not stream-parallel,
// so it runs between two pairs of loops; each intermediate is freed after its last
// reader. The middle copy's source dies at it, so forward-buffers marks it
// `forwards_source`: its out is the source buffer, and no byte moves
// (`forward_buffers=false` prints pr4147's program as it is).

// CHECK-LABEL: func.func @three_sets(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[T1:[^ ]+]] = hir.allocate(%[[N1:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N1]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[I:[^ ]+]] = {{.*}} to %[[N1]]
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]]
// CHECK-NEXT:      %[[T1_I:[^ ]+]] = hir.alias_select %[[T1]][0 = %[[I]]]
// CHECK-NEXT:      hir.copy ins(%[[IN_I]] : {{.*}}) outs(%[[T1_I]] : {{[^)]*}}){{$}}
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[T2:[^ ]+]] = hir.allocate
// FWD-NEXT:      hir.copy ins(%[[T1]] : !fusion.tensor<[?, ?], f32, axes = [stream, _]>) outs(%[[T2]] : !fusion.tensor<[?, ?], f32>) forwards_source{{$}}
// REF-NEXT:      hir.copy ins(%[[T1]] : !fusion.tensor<[?, ?], f32, axes = [stream, _]>) outs(%[[T2]] : !fusion.tensor<[?, ?], f32>){{$}}
// CHECK-NEXT:    hir.deallocate %[[T1]]
// CHECK-NEXT:    %[[T3:[^ ]+]] = hir.allocate(%[[N3:[^,)]+]]{{.*}}
// CHECK-NEXT:    scf.for {{.*}} to %[[N3]]
// CHECK:           hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[K:[^ ]+]] = {{.*}} to %[[N3]]
// CHECK:           %[[T2_K:[^ ]+]] = hir.alias_select %[[T2]][0 = %[[K]]]
// CHECK-NEXT:      %[[T3_K:[^ ]+]] = hir.alias_select %[[T3]][0 = %[[K]]]
// CHECK-NEXT:      hir.copy ins(%[[T2_K]] : {{.*}}) outs(%[[T3_K]] : {{[^)]*}}){{$}}
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    hir.deallocate %[[T2]]
// CHECK-NEXT:    func.return %[[T3]]
