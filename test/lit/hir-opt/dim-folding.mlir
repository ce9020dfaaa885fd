// RUN: hir-opt %s -p canonicalize | filecheck %s

// canonicalize folds the hir.dim whose extent the program states: a static axis's and a
// didx axis's (the mesh's size) into constants, an allocated buffer's dynamic axis (through
// its views) into the allocation's size operand. An input's dynamic axis stays: only the
// running program knows it.

!in = !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2], axes = [didx, _, _]>
!buf = !fusion.tensor<[?, 4, ?], f32, axes = [stream, _, _]>
!row = !fusion.tensor<[4, ?], f32>

func.func @dims(%a: !in, %n: index, %m: index, %i: index) -> (index, index, index, index, index) {
  %devices = hir.dim %a, 0 : !in
  %static = hir.dim %a, 1 : !in
  %input = hir.dim %a, 2 : !in
  %b = hir.allocate(%n, %m) : !buf
  %row = hir.alias_select %b[0 = %i] : !buf -> !row
  %allocated = hir.dim %row, 1 : !row
  %slices = hir.dim %b, 0 : !buf
  hir.deallocate %b : !buf
  func.return %devices, %static, %input, %allocated, %slices : index, index, index, index, index
}

// CHECK-LABEL: func.func @dims(
// CHECK-SAME:      %[[A:[^:]+]]: {{.*}}, %[[N:[^:]+]]: index, %[[M:[^:]+]]: index, %{{[^:]+}}: index)
// CHECK-DAG:     %[[THREE:[^ ]+]] = arith.constant 3 : index
// CHECK-DAG:     %[[FOUR:[^ ]+]] = arith.constant 4 : index
// CHECK-DAG:     %[[INPUT:[^ ]+]] = hir.dim %[[A]], 2
// CHECK-NOT:     hir.dim
// CHECK:         func.return %[[THREE]], %[[FOUR]], %[[INPUT]], %[[M]], %[[N]] :
