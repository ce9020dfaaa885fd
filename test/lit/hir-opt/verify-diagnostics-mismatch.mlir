// --verify-diagnostics fails (exit 1) and says why, as located errors: an annotation
// it cannot read, an error no annotation expects, an annotation with another message,
// one on another line, one where no error occurs, and warnings, notes and remarks,
// which hostir never reports.
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

// -----

func.func @other_severities(%x: !fusion.tensor<[4], f32>) {
  // expected-warning@+3 {{a warning}}
  // expected-note@+2 {{a note}}
  // expected-remark@+1 {{a remark}}
  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

func.func @unreadable(%x: !fusion.tensor<[4], f32>) {
  // expected-error@3 {{an absolute line}}
  // expected-error-re {{bad {{[regex}}}}
  func.return
}

// Then the annotations that cannot be read.
// CHECK: [[FILE]]:[[# @LINE - 6]]:6: error: cannot read the annotation 'expected-{{e}}rror@3': expected expected-{{e}}rror, then -re, @above, @below, @+N or @-N, then {{[{][{]}}message{{[}][}]}}
// CHECK-NEXT: {{^}}  // expected-{{e}}rror@3 {{[{][{]}}an absolute line
// CHECK-NEXT: {{^}}     ^^^^^^^^^^^^^^^^{{$}}
// CHECK: [[FILE]]:[[# @LINE - 8]]:6: error: cannot read the regular expression of the annotation

// The annotations no error produced come last, in the order of the file.
// CHECK: [[FILE]]:17:6: error: expected error "result shape [3]" was not produced
// CHECK-NEXT: {{^}}  // expected-{{e}}rror@+1
// CHECK: [[FILE]]:26:6: error: expected error "result shape [5]" was not produced
// CHECK: [[FILE]]:34:6: error: expected error "never produced" was not produced
// CHECK: error: expected warning "a warning" was not produced
// CHECK: error: expected note "a note" was not produced
// CHECK: error: expected remark "a remark" was not produced
// CHECK-NOT: error:
