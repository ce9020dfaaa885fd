// The exact text of errors: `file:line:col: error: message`, the source line and a
// caret under the culprit, with the line numbers of the whole file in every chunk;
// every chunk is processed and the exit status is non-zero.
// RUN: not hir-opt %s --split-input-file 2>&1 >/dev/null | filecheck %s --strict-whitespace -DFILE=%s

// A type error is reported on the type's text.
// CHECK: [[FILE]]:[[# @LINE + 3]]:42: error: didx axis 0 has extent 4 but the mesh has 2 device(s); a didx axis spans the mesh
// CHECK-NEXT: {{^}}func.func @didx_extent(%x: !fusion.tensor<[4], f32, mesh = [0, 1], axes = [didx]>) {{[{]}}
// CHECK-NEXT: {{^}}                                         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^{{$}}
func.func @didx_extent(%x: !fusion.tensor<[4], f32, mesh = [0, 1], axes = [didx]>) {
  func.return
}

// -----

// A verifier error points at the op (its first token).
// CHECK-NEXT: [[FILE]]:[[# @LINE + 4]]:3: error: result shape [8] does not match the shape [4] that the operands give
// CHECK-NEXT: {{^}}  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[8], f32>{{$}}
// CHECK-NEXT: {{^}}  ^{{$}}
func.func @verifier(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[8], f32>
  func.return
}

// -----

// A syntax error marks the unexpected token.
// CHECK-NEXT: [[FILE]]:[[# @LINE + 3]]:56: error: unknown parallel type 'sharded'; expected _ (or serial), didx or stream
// CHECK-NEXT: {{^}}func.func @syntax(%x: !fusion.tensor<[4], f32, axes = [sharded]>) {{[{]}}
// CHECK-NEXT: {{^}}                                                       ^^^^^^^{{$}}
func.func @syntax(%x: !fusion.tensor<[4], f32, axes = [sharded]>) {
  func.return
}

// -----

// A valid chunk after the errors is still processed (its output goes to stdout).
// CHECK-NOT: error
func.func @valid() {
  func.return
}
