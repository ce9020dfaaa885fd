// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// A matmul that would turn its lhs's didx axis into its stream axis itself: only the
// point-to-point allgather covers didx -> stream (insert-reshardings puts one before).
func.func @matmul_didx_to_stream(%a: !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>, %b: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>) -> !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]> {
  %m = hir.dim %a, 1 : !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
  %n = hir.dim %b, 1 : !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>
  %c = hir.allocate(%m, %n) : !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
  // CHECK: [[# @LINE + 1]]:3: error: the stream axis 0 of the output !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]> of hir.matmul is the didx axis 0 of operand 0 `lhs` (input #0 of @matmul_didx_to_stream) of type !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>; only an allgather or a copy can turn a didx axis into a stream axis
  hir.matmul ins(%a, %b : !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>, !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>) outs(%c : !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>)
  func.return %c : !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
}
