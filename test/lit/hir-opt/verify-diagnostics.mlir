// --verify-diagnostics passes (exit 0) when every error is annotated where it occurs:
// on its own line (`expected-error`), N lines below or above (`@+N`, `@-N`), or on the
// line below or above (`@below`, `@above`); an annotation matches an error whose
// message contains its text, or, with `expected-error-re`, whose `{{...}}` parts
// match as regular expressions.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

func.func @same_line(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[8], f32> // expected-error {{result shape [8] does not match}}
  func.return
}

// -----

func.func @line_below(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+2 {{result shape [2] does not match the shape [4] that the operands give}}

  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[2], f32>
  func.return
}

// -----

func.func @line_above(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[3], f32>
  // expected-error@-1 {{[3]}}
  func.return
}

// -----

func.func @below(%x: !fusion.tensor<[4], f32>) {
  // expected-error@below {{result shape [6] does not match}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[6], f32>
  func.return
}

// -----

func.func @above(%x: !fusion.tensor<[4], f32>) {
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[7], f32>
  // expected-error@above {{result shape [7]}}
  func.return
}

// -----

func.func @regex(%x: !fusion.tensor<[4], f32>) {
  // expected-error-re@+1 {{result shape [{{[0-9]+}}] does not match the shape [4]}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[9], f32>
  func.return
}

// -----

// A chunk without errors needs no annotation.
func.func @valid(%x: !fusion.tensor<[4], f32>) {
  func.return
}
