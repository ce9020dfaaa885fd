// RUN: hir-opt %s --split-input-file --verify-diagnostics -p insert-reshardings

// An operand whose static extent cannot be sharded over the result's mesh: the result's
// didx axis is `?`, so the types verify, but no layout of the operand matches it.

func.func @extent_not_the_mesh_size(%x: !fusion.tensor<[5], f32, mesh = [0, 1, 2, 3]>, %y: !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3], axes = [didx]>) -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3], axes = [didx]> {
  // expected-error@+1 {{fusion.add: operand 0 `lhs` (input #0 of @extent_not_the_mesh_size) of shape [5] cannot be laid out as the result, mesh = [0, 1, 2, 3], axes = [didx]: didx axis 0 has extent 5 but the mesh has 4 device(s)}}
  %z = fusion.add %x, %y : (!fusion.tensor<[5], f32, mesh = [0, 1, 2, 3]>, !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3], axes = [didx]>) -> !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3], axes = [didx]>
  func.return %z : !fusion.tensor<[?], f32, mesh = [0, 1, 2, 3], axes = [didx]>
}
