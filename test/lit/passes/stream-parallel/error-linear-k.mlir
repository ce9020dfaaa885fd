// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// A linear whose K axis is the stream axis of its weight.
func.func @linear_k(%x: !fusion.tensor<[?, ?], f32>, %w: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %m = hir.dim %x, 0 : !fusion.tensor<[?, ?], f32>
  %n = hir.dim %w, 0 : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  %y = hir.allocate(%m, %n) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  // CHECK: [[# @LINE + 1]]:3: error: hir.linear contracts axis 1 of operand 1 `weight` (input #1 of @linear_k) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis
  hir.linear ins(%x, %w : !fusion.tensor<[?, ?], f32>, !fusion.tensor<[?, ?], f32, axes = [_, stream]>) outs(%y : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %y : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}
