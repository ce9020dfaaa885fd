// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// nvFuser's SingleSetOp: one stream-parallel copy. The streams synchronise with the
// caller's stream in their own loop, before the work loop (pr4401).

func.func @single_set(%in: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %d0 = hir.dim %in, 0 : !fusion.tensor<[?, ?], f32>
  %d1 = hir.dim %in, 1 : !fusion.tensor<[?, ?], f32>
  %out = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  hir.copy ins(%in : !fusion.tensor<[?, ?], f32>) outs(%out : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %out : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// CHECK-LABEL: func.func @single_set(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK-NEXT:    %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK-NEXT:    %[[C1:[^ ]+]] = arith.constant 1 : index
// CHECK-NEXT:    %[[MAIN:[^ ]+]] = hir.get_current_stream
// CHECK-NEXT:    %[[NS:[^ ]+]] = hir.number_of_streams
// CHECK-NEXT:    hir.dim
// CHECK-NEXT:    hir.dim
// CHECK-NEXT:    %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 0
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

// nvFuser's SingleSetOpNonOutermost: the stream axis is axis 1; both buffers are
// sliced along it.

func.func @single_set_non_outermost(%in: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [_, stream]> {
  %d0 = hir.dim %in, 0 : !fusion.tensor<[?, ?], f32>
  %d1 = hir.dim %in, 1 : !fusion.tensor<[?, ?], f32>
  %out = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  hir.copy ins(%in : !fusion.tensor<[?, ?], f32>) outs(%out : !fusion.tensor<[?, ?], f32, axes = [_, stream]>)
  func.return %out : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
}

// CHECK-LABEL: func.func @single_set_non_outermost(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK-NEXT:    %[[N:[^ ]+]] = hir.dim %[[OUT]], 1
// CHECK-NEXT:    scf.for %{{.*}} to %[[N]]
// CHECK:         hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for %[[K:[^ ]+]] = %{{.*}} to %[[N]]
// CHECK:           %[[IN_K:[^ ]+]] = hir.alias_select %[[IN]][1 = %[[K]]]
// CHECK-NEXT:      %[[OUT_K:[^ ]+]] = hir.alias_select %[[OUT]][1 = %[[K]]]
// CHECK-NEXT:      hir.copy ins(%[[IN_K]] : !fusion.tensor<[?], f32>) outs(%[[OUT_K]] : !fusion.tensor<[?], f32>)
// CHECK-NEXT:      hir.set_current_stream
// CHECK-NEXT:      hir.synchronize_stream
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %[[OUT]]
