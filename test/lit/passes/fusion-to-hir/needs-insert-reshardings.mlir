// RUN: hir-opt %s --split-input-file --verify-diagnostics -p fusion-to-hir

// Without insert-reshardings, an op that cannot compute where its operands live is
// an error that says which pass moves them.

func.func @matmul(%a: !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _]>, %b: !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>) -> !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]> {
  // expected-error@+1 {{fusion.matmul: operand 0 `lhs` (input #0 of @matmul) is at mesh = [0, 1, 2, 3], axes = [_, didx, _] but the op computes at mesh = [0, 1, 2, 3], axes = [stream, _, _]; run insert-reshardings first, which moves it with a fusion.set}}
  %c = fusion.matmul %a, %b : (!fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _]>, !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>) -> !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
  func.return %c : !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>
}

// -----

func.func @pointwise(%x: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 3], f32, mesh = [2, 3], axes = [didx, _]> {
  // expected-error@+1 {{fusion.exp: operand 0 `input` (input #0 of @pointwise) is at mesh = [0, 1], axes = [didx, _] but the op computes at mesh = [2, 3], axes = [didx, _]; run insert-reshardings first}}
  %y = fusion.exp %x : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 3], f32, mesh = [2, 3], axes = [didx, _]>
  func.return %y : !fusion.tensor<[2, 3], f32, mesh = [2, 3], axes = [didx, _]>
}

// -----

func.func @local_reduction(%x: !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2], f32, mesh = [0, 1]> {
  // expected-error@+1 {{fusion.sum: operand 0 `input` (input #0 of @local_reduction) is at mesh = [0, 1], axes = [didx, _] but the op computes at mesh = [0, 1], axes = [_, _]}}
  %y = fusion.sum %x [1] : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return %y : !fusion.tensor<[2], f32, mesh = [0, 1]>
}

// -----

func.func @didx_and_other_axes(%x: !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[], f32, mesh = [0, 1]> {
  // expected-error@+1 {{fusion.sum: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [0, 1], axes = []: the reduction over the didx axis also reduces axes [1]; insert-reshardings splits it in two}}
  %y = fusion.sum %x [0, 1] : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[], f32, mesh = [0, 1]>
  func.return %y : !fusion.tensor<[], f32, mesh = [0, 1]>
}
