// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// A matmul whose K axis is the stream axis of its lhs.
func.func @matmul_k(%a: !fusion.tensor<[?, ?], f32, axes = [_, stream]>, %b: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?, ?], f32> {
  %m = hir.dim %a, 0 : !fusion.tensor<[?, ?], f32, axes = [_, stream]>
  %n = hir.dim %b, 1 : !fusion.tensor<[?, ?], f32>
  %c = hir.allocate(%m, %n) : !fusion.tensor<[?, ?], f32>
  // CHECK: [[# @LINE + 1]]:3: error: hir.matmul contracts axis 1 of operand 0 `lhs` (input #0 of @matmul_k) of type !fusion.tensor<[?, ?], f32, axes = [_, stream]>, which is that operand's stream axis
  hir.matmul ins(%a, %b : !fusion.tensor<[?, ?], f32, axes = [_, stream]>, !fusion.tensor<[?, ?], f32>) outs(%c : !fusion.tensor<[?, ?], f32>)
  func.return %c : !fusion.tensor<[?, ?], f32>
}
