// RUN: hir-opt %s --split-input-file --verify-diagnostics -p insert-reshardings,fusion-to-hir
// RUN: not hir-opt %s --split-input-file -p insert-reshardings,fusion-to-hir 2>&1 | filecheck %s

// Sharding changes that no communication makes, and ops that fusion-to-hir cannot
// lower, are errors that name the op and both shardings.

// CHECK: errors.mlir:[[# @LINE + 5]]:3: error: fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [2, 3], axes = [_, didx]: no communication moves a didx axis to another axis
// CHECK-NEXT: {{^}}  %y = fusion.set %x
// CHECK-NEXT: {{^}}  ^{{$}}
func.func @didx_to_another_axis_and_mesh(%x: !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 2], f32, mesh = [2, 3], axes = [_, didx]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [2, 3], axes = [_, didx]: no communication moves a didx axis to another axis}}
  %y = fusion.set %x : !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 2], f32, mesh = [2, 3], axes = [_, didx]>
  func.return %y : !fusion.tensor<[2, 2], f32, mesh = [2, 3], axes = [_, didx]>
}

// -----

func.func @didx_to_another_axis(%x: !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [_, didx]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [0, 1], axes = [_, didx]: no communication moves a didx axis to another axis}}
  %y = fusion.set %x : !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [_, didx]>
  func.return %y : !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [_, didx]>
}

// -----

func.func @gather_onto_another_mesh(%x: !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, ?], f32, mesh = [2, 3]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [2, 3], axes = [_, _]: no communication changes both the mesh and the didx axis}}
  %y = fusion.set %x : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [2, 3]>
  func.return %y : !fusion.tensor<[2, ?], f32, mesh = [2, 3]>
}

// -----

func.func @meshes_of_other_sizes(%x: !fusion.tensor<[?, 4], f32, mesh = [0, 1]>) -> !fusion.tensor<[?, 4], f32, mesh = [2, 3, 4]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 1], axes = [_, _] to mesh = [2, 3, 4], axes = [_, _]: a change of mesh that keeps the layout pairs the devices one to one, so the meshes must have equal sizes}}
  %y = fusion.set %x : !fusion.tensor<[?, 4], f32, mesh = [0, 1]> -> !fusion.tensor<[?, 4], f32, mesh = [2, 3, 4]>
  func.return %y : !fusion.tensor<[?, 4], f32, mesh = [2, 3, 4]>
}

// -----

func.func @send_to_itself(%x: !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 1], axes = [didx, _] to mesh = [0, 2], axes = [didx, _]: device 0 is at the same position of both meshes, so send_recv would send to itself}}
  %y = fusion.set %x : !fusion.tensor<[2, ?], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>
  func.return %y : !fusion.tensor<[2, ?], f32, mesh = [0, 2], axes = [didx, _]>
}

// -----

func.func @slice_in_a_mesh_with_gaps(%x: !fusion.tensor<[?, 3], f32, mesh = [0, 2, 4]>) -> !fusion.tensor<[?, 3], f32, mesh = [0, 2, 4], axes = [_, didx]> {
  // expected-error@+1 {{fusion.set: cannot lower the change from mesh = [0, 2, 4], axes = [_, _] to mesh = [0, 2, 4], axes = [_, didx]: a device finds its slice by its index in the mesh, which is its id minus 0 only in a mesh of consecutive devices}}
  %y = fusion.set %x : !fusion.tensor<[?, 3], f32, mesh = [0, 2, 4]> -> !fusion.tensor<[?, 3], f32, mesh = [0, 2, 4], axes = [_, didx]>
  func.return %y : !fusion.tensor<[?, 3], f32, mesh = [0, 2, 4], axes = [_, didx]>
}

// -----

func.func @reduce_onto_another_mesh(%x: !fusion.tensor<[?, 2], f32, mesh = [0, 1], axes = [_, didx]>) -> !fusion.tensor<[?], f32, mesh = [2, 3]> {
  // expected-error@+1 {{fusion.sum: cannot lower the change from mesh = [0, 1], axes = [_, didx] to mesh = [2, 3], axes = [_]: a reduction over the didx axis ends on the input's mesh or on a single device}}
  %y = fusion.sum %x [1] : !fusion.tensor<[?, 2], f32, mesh = [0, 1], axes = [_, didx]> -> !fusion.tensor<[?], f32, mesh = [2, 3]>
  func.return %y : !fusion.tensor<[?], f32, mesh = [2, 3]>
}

// -----

// An op that fusion-to-hir reaches before its value was produced by a fusion op.

func.func @fusion_op_on_a_view(%x: !fusion.tensor<[?, ?], f32>) -> !fusion.tensor<[?], f32> {
  %i = arith.constant 0 : index
  // expected-error@+1 {{hir.alias_select: fusion-to-hir lowers fusion ops only, and cannot size a buffer computed by another op}}
  %v = hir.alias_select %x[0 = %i] : !fusion.tensor<[?, ?], f32> -> !fusion.tensor<[?], f32>
  %y = fusion.neg %v : !fusion.tensor<[?], f32> -> !fusion.tensor<[?], f32>
  func.return %y : !fusion.tensor<[?], f32>
}
