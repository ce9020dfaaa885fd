// Syntax errors: each is reported where the text goes wrong.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

// expected-error@+1 {{'[' expected}}
func.func @shape_without_brackets(%x: !fusion.tensor<4, f32>) {
  func.return
}

// -----

// expected-error@+1 {{unknown parallel type 'sharded'; expected _ (or serial), didx or stream}}
func.func @unknown_parallel_type(%x: !fusion.tensor<[4], f32, axes = [sharded]>) {
  func.return
}

// -----

// expected-error@+1 {{'>' expected}}
func.func @missing_angle_bracket(%x: !fusion.tensor<[4], f32) {
  func.return
}

// -----

func.func @unknown_op(%x: !fusion.tensor<[4], f32>) {
  // expected-error@+1 {{Operation fusion.frobnicate is not registered}}
  %y = fusion.frobnicate %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>
  func.return
}

// -----

// expected-error@+1 {{Expected integer literal or '?' as an extent}}
func.func @negative_extent(%x: !fusion.tensor<[-4], f32>) {
  func.return
}

// -----

// expected-error@+1 {{Expected one of 'axes', 'mesh' in a fusion.tensor type}}
func.func @unknown_type_keyword(%x: !fusion.tensor<[4], f32, layout = [0]>) {
  func.return
}

// -----

// expected-error@+1 {{Expected '='}}
func.func @mesh_without_equals(%x: !fusion.tensor<[4], f32, mesh [0, 1]>) {
  func.return
}

// -----

func.func @missing_backend(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{Expected 'backend'}}
  %w = hir.allgather %x into %y team [0, 1] : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @unknown_backend(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{Expected `nccl`, or `cuda`}}
  %w = hir.allgather %x into %y team [0, 1] backend mpi : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @unknown_reduction_kind(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{Expected `sum`, `max`, `min`}}
  %w = hir.allreduce %x into %y team [0, 1] op mean backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @alias_select_without_index(%x: !fusion.tensor<[4, 2], f32>) {
  // expected-error@+1 {{Expected '='}}
  %y = hir.alias_select %x[0] : !fusion.tensor<[4, 2], f32> -> !fusion.tensor<[2], f32>
  func.return
}

// -----

func.func @constant_of_a_scalar_type() {
  // expected-error@+1 {{i1 should be of base attribute fusion.tensor}}
  %c = fusion.constant true : i1
  func.return
}
