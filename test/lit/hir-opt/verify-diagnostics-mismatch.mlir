// --verify-diagnostics fails (exit 1) and says why, as located errors: an error no
// annotation expects, an annotation with another message, one on another line, and
// one where no error occurs.
// RUN: not hir-opt %s --split-input-file --verify-diagnostics 2>&1 >/dev/null | filecheck %s -DFILE=%s

// CHECK: [[FILE]]:[[# @LINE + 2]]:3: error: unexpected error: result shape [8] does not match the shape [4] that the operands give
func.func @unannotated(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[8], f32>
  func.return
}

// -----

// CHECK: [[FILE]]:[[# @LINE + 3]]:3: error: unexpected error: result shape [2] does not match the shape [4] that the operands give
func.func @other_message(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{result shape [3]}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[2], f32>
  func.return
}

// -----

// CHECK: [[FILE]]:[[# @LINE + 3]]:3: error: unexpected error: result shape [5] does not match
func.func @other_line(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+2 {{result shape [5]}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[5], f32>
  func.return
}

// -----

func.func @no_error(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{never produced}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// The annotations no error produced come last, in the order of the file.
// CHECK: [[FILE]]:16:6: error: expected error "result shape [3]" was not produced
// CHECK-NEXT: {{^}}  // expected-{{e}}rror@+1
// CHECK: [[FILE]]:25:6: error: expected error "result shape [5]" was not produced
// CHECK: [[FILE]]:33:6: error: expected error "never produced" was not produced
// CHECK-NOT: error:
