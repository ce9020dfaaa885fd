// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// The point-to-point allgather peers with device i + first device of the mesh.
func.func @p2p_sparse_mesh(%a: !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>) -> !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]> {
  %m = hir.dim %a, 1 : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>
  %g = hir.allocate(%m) : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]>
  // CHECK: [[# @LINE + 1]]:3: error: the point-to-point allgather of hir.allgather from operand 0 `input` (input #0 of @p2p_sparse_mesh) of type !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]> needs a mesh of consecutive devices
  %w = hir.allgather %a into %g team [0, 2] backend nccl : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>, !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]>
  hir.wait %w
  func.return %g : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [stream, _]>
}
