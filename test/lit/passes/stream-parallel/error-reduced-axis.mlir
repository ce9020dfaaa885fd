// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// A sum over the stream axis: each iteration would hold a partial sum.
func.func @sum_over_stream(%x: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?], f32> {
  %d0 = hir.dim %x, 0 : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  %y = hir.allocate(%d0) : !fusion.tensor<[?], f32>
  // CHECK: [[# @LINE + 1]]:3: error: hir.reduction reduces axis 1 of operand 0 `input` (input #0 of @sum_over_stream) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis; a reduced axis cannot be stream-parallel
  hir.reduction "sum" [1] ins(%x : !fusion.tensor<[?, ?], f32, axes = [_, stream]>) outs(%y : !fusion.tensor<[?], f32>)
  func.return %y : !fusion.tensor<[?], f32>
}
