// An operand that needs a resharding no communication implements is refused by
// insert-reshardings at the user's op, naming the op, the operand and both
// shardings, not later as a fusion.set the user never wrote.
// RUN: hir-opt %s --split-input-file --verify-diagnostics -p insert-reshardings
// RUN: hir-opt %s --split-input-file --verify-diagnostics -p hir-lowering
// RUN: not hir-opt %s --split-input-file -p hir-lowering 2>&1 | filecheck %s --strict-whitespace -DFILE=%s

!rows = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!cols = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>

// CHECK: {{^}}[[FILE]]:[[# @LINE + 5]]:3: error: fusion.add: operand 1 `rhs` (input #1 of @add) must be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] to mesh = [0, 1, 2, 3], axes = [didx, _] (by a fusion.set that insert-reshardings inserts), and no communication does that: no communication moves a didx axis to another axis{{$}}
// CHECK-NEXT: {{^}}  %c = fusion.add %a, %b : (!rows, !cols) -> !rows{{$}}
// CHECK-NEXT: {{^}}  ^{{$}}
func.func @add(%a: !rows, %b: !cols) -> !rows {
  // expected-error@+1 {{fusion.add: operand 1 `rhs` (input #1 of @add) must be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] to mesh = [0, 1, 2, 3], axes = [didx, _]}}
  %c = fusion.add %a, %b : (!rows, !cols) -> !rows
  func.return %c : !rows
}

// -----

!rows = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!cols = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>

// One set serves both operands; the error names both.
// CHECK: {{^}}[[FILE]]:[[# @LINE + 3]]:3: error: fusion.mul: operand 0 `lhs` (input #0 of @same_operand_twice) and operand 1 `rhs` (input #0 of @same_operand_twice) must each be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] to mesh = [0, 1, 2, 3], axes = [didx, _]
func.func @same_operand_twice(%b: !cols) -> !rows {
  // expected-error@+1 {{fusion.mul: operand 0 `lhs` (input #0 of @same_operand_twice) and operand 1 `rhs` (input #0 of @same_operand_twice) must each be resharded}}
  %c = fusion.mul %b, %b : (!cols, !cols) -> !rows
  func.return %c : !rows
}

// -----

!cols = !fusion.tensor<[4, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>
!far = !fusion.tensor<[4, 4], f32, mesh = [4, 5, 6, 7], axes = [didx, _]>

// A change of mesh and of the didx axis at once.
// CHECK: {{^}}[[FILE]]:[[# @LINE + 3]]:3: error: fusion.neg: operand 0 `input` (input #0 of @other_mesh) must be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] to mesh = [4, 5, 6, 7], axes = [didx, _] {{.*}}: no communication
func.func @other_mesh(%b: !cols) -> !far {
  // expected-error@+1 {{fusion.neg: operand 0 `input` (input #0 of @other_mesh) must be resharded from mesh = [0, 1, 2, 3], axes = [_, didx] to mesh = [4, 5, 6, 7], axes = [didx, _]}}
  %c = fusion.neg %b : !cols -> !far
  func.return %c : !far
}
