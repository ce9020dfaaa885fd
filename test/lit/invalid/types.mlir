// Invalid !fusion.tensor types and meshes: the error is on the type's text.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

// expected-error@+1 {{tensor of rank 2 has 1 parallel types; give one per axis}}
func.func @axes_count(%x: !fusion.tensor<[4, 4], f32, axes = [_]>) {
  func.return
}

// -----

// expected-error@+1 {{didx axis 0 has extent 3 but the mesh has 2 device(s); a didx axis spans the mesh}}
func.func @didx_extent(%x: !fusion.tensor<[3, 4], f32, mesh = [0, 1], axes = [didx, _]>) {
  func.return
}

// -----

// expected-error@+1 {{axes [0, 1] are both didx; a one-dimensional mesh shards at most one axis}}
func.func @two_didx(%x: !fusion.tensor<[2, 2], f32, mesh = [0, 1], axes = [didx, didx]>) {
  func.return
}

// -----

// expected-error@+1 {{axes [0, 2] are both stream; at most one axis may be stream-parallel}}
func.func @two_stream(%x: !fusion.tensor<[4, 4, 4], f32, axes = [stream, _, stream]>) {
  func.return
}

// -----

// expected-error@+1 {{device mesh [0, 1, 0] lists device(s) [0] more than once}}
func.func @duplicate_devices(%x: !fusion.tensor<[4], f32, mesh = [0, 1, 0]>) {
  func.return
}

// -----

// expected-error@+1 {{a device mesh needs at least one device}}
func.func @empty_mesh(%x: !fusion.tensor<[4], f32, mesh = []>) {
  func.return
}

// -----

// expected-error@+1 {{device mesh [2, 2] lists device(s) [2] more than once}}
func.func @duplicate_devices_attribute() attributes {team = #fusion.mesh<[2, 2]>} {
  func.return
}

// -----

// expected-error@+1 {{a device mesh needs at least one device}}
func.func @empty_mesh_attribute() attributes {team = #fusion.mesh<[]>} {
  func.return
}

// -----

// expected-error@+1 {{element type i16 is not supported; expected one of f64, f32, f16, bf16, i64, i32, i8, i1}}
func.func @unsupported_integer(%x: !fusion.tensor<[4], i16>) {
  func.return
}

// -----

// expected-error@+1 {{element type index is not supported}}
func.func @unsupported_index(%x: !fusion.tensor<[4], index>) {
  func.return
}

// -----

// expected-error@+1 {{element type f80 is not supported}}
func.func @unsupported_float(%x: !fusion.tensor<[4], f80>) {
  func.return
}

// -----

// expected-error@+1 {{Expected `serial`, `didx`, or `stream`.}}
func.func @parallel_type_attribute() attributes {p = #fusion<parallel_type sharded>} {
  func.return
}

// -----

// expected-error@+1 {{Expected `nccl`, or `cuda`.}}
func.func @backend_attribute() attributes {b = #hir<backend gloo>} {
  func.return
}
