// RUN: hir-opt %s -p stream-parallel | filecheck %s
// RUN: hir-opt %s -p stream-parallel > %t && hir-opt %s -p stream-parallel,stream-parallel | diff %t -

// Each operand is sliced along the axis that feeds the output's stream axis; an
// operand without one is used whole.

// nvFuser's Reduction: the reduced axes are renumbered for the slice.

func.func @reduction(%in: !fusion.tensor<[?, ?, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %d0 = hir.dim %in, 0 : !fusion.tensor<[?, ?, ?], f32>
  %d1 = hir.dim %in, 1 : !fusion.tensor<[?, ?, ?], f32>
  %out = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  hir.reduction "sum" [2] ins(%in : !fusion.tensor<[?, ?, ?], f32>) outs(%out : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %out : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// CHECK-LABEL: func.func @reduction(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>)
// CHECK:         %[[OUT:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][0 = %[[I]]] : !fusion.tensor<[?, ?, ?], f32> -> !fusion.tensor<[?, ?], f32>
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %[[OUT]][0 = %[[I]]]
// CHECK-NEXT:      hir.reduction "sum" [1] ins(%[[IN_I]] : !fusion.tensor<[?, ?], f32>) outs(%[[OUT_I]] : !fusion.tensor<[?], f32>)

// A stream axis after the reduced one: [?, ?, stream] -> sum [0] keepdim.

func.func @reduction_keepdim(%in: !fusion.tensor<[?, ?, ?], f32>) -> !fusion.tensor<[1, ?, ?], f32, axes = [_, _, stream]> {
  %d1 = hir.dim %in, 1 : !fusion.tensor<[?, ?, ?], f32>
  %d2 = hir.dim %in, 2 : !fusion.tensor<[?, ?, ?], f32>
  %out = hir.allocate(%d1, %d2) : !fusion.tensor<[1, ?, ?], f32, axes = [_, _, stream]>
  hir.reduction "max" [0] keepdim ins(%in : !fusion.tensor<[?, ?, ?], f32>) outs(%out : !fusion.tensor<[1, ?, ?], f32, axes = [_, _, stream]>)
  func.return %out : !fusion.tensor<[1, ?, ?], f32, axes = [_, _, stream]>
}

// CHECK-LABEL: func.func @reduction_keepdim(
// CHECK-SAME:      %[[IN:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>)
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[IN_I:[^ ]+]] = hir.alias_select %[[IN]][2 = %[[I]]]
// CHECK-NEXT:      %[[OUT_I:[^ ]+]] = hir.alias_select %{{.*}}[2 = %[[I]]]
// CHECK-NEXT:      hir.reduction "max" [0] keepdim ins(%[[IN_I]] : !fusion.tensor<[?, ?], f32>) outs(%[[OUT_I]] : !fusion.tensor<[1, ?], f32>)

// nvFuser's Matmul_M: the stream axis is M; lhs is sliced, the weight used whole.

func.func @matmul_m(%a: !fusion.tensor<[?, ?], f32>, %b: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %m = hir.dim %a, 0 : !fusion.tensor<[?, ?], f32>
  %n = hir.dim %b, 1 : !fusion.tensor<[?, ?], f32>
  %c = hir.allocate(%m, %n) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  hir.matmul ins(%a, %b : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32>) outs(%c : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %c : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// CHECK-LABEL: func.func @matmul_m(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[C:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %[[C]][0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_I]], %[[B]] : !fusion.tensor<[?], f32>, !fusion.tensor<[?, ?], f32>) outs(%[[C_I]] : !fusion.tensor<[?], f32>)

// nvFuser's Matmul_N: the stream axis is N; the rhs is sliced, not the lhs.

func.func @matmul_n(%a: !fusion.tensor<[?, ?], f32>, %b: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [_, stream]> {
  %m = hir.dim %a, 0 : !fusion.tensor<[?, ?], f32>
  %n = hir.dim %b, 1 : !fusion.tensor<[?, ?], f32>
  %c = hir.allocate(%m, %n) : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  hir.matmul ins(%a, %b : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32>) outs(%c : !fusion.tensor<[?, ?], f32, axes = [_, stream]>)
  func.return %c : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
}

// CHECK-LABEL: func.func @matmul_n(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?, ?], f32>)
// CHECK:         %[[C:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[B_I:[^ ]+]] = hir.alias_select %[[B]][1 = %[[I]]]
// CHECK-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %[[C]][1 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A]], %[[B_I]] : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) outs(%[[C_I]] : !fusion.tensor<[?], f32>)

// A batched matmul whose rhs broadcasts its batch axis (extent 1): the rhs is
// selected at index 0 in every iteration, so that the batch axes stay aligned.

func.func @matmul_broadcast_batch(%a: !fusion.tensor<[?, ?, ?], f32>, %b: !fusion.tensor<[1, ?, ?], f32>) -> !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]> {
  %s = hir.dim %a, 0 : !fusion.tensor<[?, ?, ?], f32>
  %m = hir.dim %a, 1 : !fusion.tensor<[?, ?, ?], f32>
  %n = hir.dim %b, 2 : !fusion.tensor<[1, ?, ?], f32>
  %c = hir.allocate(%s, %m, %n) : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
  hir.matmul ins(%a, %b : !fusion.tensor<[?, ?, ?], f32>, !fusion.tensor<[1, ?, ?], f32>) outs(%c : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>)
  func.return %c : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
}

// CHECK-LABEL: func.func @matmul_broadcast_batch(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[1, ?, ?], f32>)
// CHECK:         %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[B_0:[^ ]+]] = hir.alias_select %[[B]][0 = %[[C0]]] : !fusion.tensor<[1, ?, ?], f32> -> !fusion.tensor<[?, ?], f32>
// CHECK-NEXT:      %[[C_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// CHECK-NEXT:      hir.matmul ins(%[[A_I]], %[[B_0]] : {{.*}}) outs(%[[C_I]] :

// A linear with a bias, stream-parallel on a batch axis (pr3736's GEMM): weight and
// bias are used whole.

!x = !fusion.tensor<[?, ?, ?], f32>
!w = !fusion.tensor<[?, ?], f32>
!b = !fusion.tensor<[?], f32>

func.func @linear_batch(%x: !x, %w: !w, %b: !b) -> !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]> {
  %s = hir.dim %x, 0 : !x
  %m = hir.dim %x, 1 : !x
  %n = hir.dim %w, 0 : !w
  %y = hir.allocate(%s, %m, %n) : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
  hir.linear ins(%x, %w, %b : !x, !w, !b) outs(%y : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>)
  func.return %y : !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>
}

// CHECK-LABEL: func.func @linear_batch(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>, %[[W:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?], f32>)
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[X_I:[^ ]+]] = hir.alias_select %[[X]][0 = %[[I]]]
// CHECK-NEXT:      %[[Y_I:[^ ]+]] = hir.alias_select %{{.*}}[0 = %[[I]]]
// CHECK-NEXT:      hir.linear ins(%[[X_I]], %[[W]], %[[B]] : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) outs(%[[Y_I]] : !fusion.tensor<[?, ?], f32>)

// The same linear, stream-parallel on N: weight axis 0 and the bias are sliced.

func.func @linear_n(%x: !x, %w: !w, %b: !b) -> !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]> {
  %s = hir.dim %x, 0 : !x
  %m = hir.dim %x, 1 : !x
  %n = hir.dim %w, 0 : !w
  %y = hir.allocate(%s, %m, %n) : !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]>
  hir.linear ins(%x, %w, %b : !x, !w, !b) outs(%y : !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]>)
  func.return %y : !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]>
}

// CHECK-LABEL: func.func @linear_n(
// CHECK-SAME:      %[[X:[^:]+]]: !fusion.tensor<[?, ?, ?], f32>, %[[W:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[B:[^:]+]]: !fusion.tensor<[?], f32>)
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[W_I:[^ ]+]] = hir.alias_select %[[W]][0 = %[[I]]] : !fusion.tensor<[?, ?], f32> -> !fusion.tensor<[?], f32>
// CHECK-NEXT:      %[[B_I:[^ ]+]] = hir.alias_select %[[B]][0 = %[[I]]] : !fusion.tensor<[?], f32> -> !fusion.tensor<[], f32>
// CHECK-NEXT:      %[[Y_I:[^ ]+]] = hir.alias_select %{{.*}}[2 = %[[I]]]
// CHECK-NEXT:      hir.linear ins(%[[X]], %[[W_I]], %[[B_I]] : {{.*}}) outs(%[[Y_I]] : !fusion.tensor<[?, ?], f32>)

// nvFuser's SingleBinaryOp, with broadcasting: an operand of lower rank has no
// stream axis and is used whole; one with an extent-1 axis there is selected at 0.

func.func @binary(%a: !fusion.tensor<[?, ?], f32>, %r: !fusion.tensor<[?], f32>, %o: !fusion.tensor<[1, ?], f32>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %d0 = hir.dim %a, 0 : !fusion.tensor<[?, ?], f32>
  %d1 = hir.dim %a, 1 : !fusion.tensor<[?, ?], f32>
  %x = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  hir.pointwise "add" ins(%a, %r : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?], f32>) outs(%x : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  %y = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  hir.pointwise "mul" ins(%x, %o : !fusion.tensor<[?, ?], f32, axes = [stream, _]>, !fusion.tensor<[1, ?], f32>) outs(%y : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %y : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}

// CHECK-LABEL: func.func @binary(
// CHECK-SAME:      %[[A:[^:]+]]: !fusion.tensor<[?, ?], f32>, %[[R:[^:]+]]: !fusion.tensor<[?], f32>, %[[O:[^:]+]]: !fusion.tensor<[1, ?], f32>)
// CHECK:         %[[C0:[^ ]+]] = arith.constant 0 : index
// CHECK:         %[[X:[^ ]+]] = hir.allocate
// CHECK:         %[[Y:[^ ]+]] = hir.allocate
// CHECK:         scf.for
// CHECK:         scf.for %[[I:[^ ]+]] =
// CHECK:           %[[A_I:[^ ]+]] = hir.alias_select %[[A]][0 = %[[I]]]
// CHECK-NEXT:      %[[X_I:[^ ]+]] = hir.alias_select %[[X]][0 = %[[I]]]
// CHECK-NEXT:      hir.pointwise "add" ins(%[[A_I]], %[[R]] : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) outs(%[[X_I]] :
// CHECK-NEXT:      %[[O_0:[^ ]+]] = hir.alias_select %[[O]][0 = %[[C0]]]
// CHECK-NEXT:      %[[Y_I:[^ ]+]] = hir.alias_select %[[Y]][0 = %[[I]]]
// CHECK-NEXT:      hir.pointwise "mul" ins(%[[X_I]], %[[O_0]] : !fusion.tensor<[?], f32>, !fusion.tensor<[?], f32>) outs(%[[Y_I]] :
