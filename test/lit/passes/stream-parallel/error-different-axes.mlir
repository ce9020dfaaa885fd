// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// Two operands streamed along different axes of the output: no loop walks both.
func.func @different_axes(%x: !fusion.tensor<[?, ?], f32, axes = [stream, _]>, %y: !fusion.tensor<[?, ?], f32, axes = [_, stream]>) -> !fusion.tensor<[?, ?], f32, axes = [stream, _]> {
  %d0 = hir.dim %x, 0 : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  %d1 = hir.dim %x, 1 : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  %z = hir.allocate(%d0, %d1) : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
  // CHECK: [[# @LINE + 1]]:3: error: the stream axes of the operands of hir.pointwise map to different axes [0, 1] of its output !fusion.tensor<[?, ?], f32, axes = [stream, _]>: axis 0 from operand 0 `lhs` (input #0 of @different_axes) of type !fusion.tensor<[?, ?], f32, axes = [stream, _]>; axis 1 from operand 1 `rhs` (input #1 of @different_axes) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  hir.pointwise "add" ins(%x, %y : !fusion.tensor<[?, ?], f32, axes = [stream, _]>, !fusion.tensor<[?, ?], f32, axes = [_, stream]>) outs(%z : !fusion.tensor<[?, ?], f32, axes = [stream, _]>)
  func.return %z : !fusion.tensor<[?, ?], f32, axes = [stream, _]>
}
