// --verify-diagnostics passes (exit 0) when every error is annotated where it occurs:
// on its own line (`expected-error`), or N lines below or above (`@+N`, `@-N`); an
// annotation matches an error whose message contains its text.
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

// A chunk without errors needs no annotation.
func.func @valid(%x: !fusion.tensor<[4], f32>) {
  func.return
}
