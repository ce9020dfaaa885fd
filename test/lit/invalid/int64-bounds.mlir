// Extents must fit in a signed 64-bit integer (the runtime's torch sizes), device
// ids in a signed 32-bit one (torch.distributed ranks); a larger one is an error on
// the type's or the list's text. The largest of each is accepted.
// RUN: hir-opt %s --split-input-file --verify-diagnostics
// RUN: not hir-opt %s 2>&1 | filecheck %s --strict-whitespace -DFILE=%s

// CHECK: {{^}}[[FILE]]:[[# @LINE + 4]]:37: error: axis 0 has extent 99999999999999999999, too large: an extent must fit in a signed 64-bit integer (at most 9223372036854775807){{$}}
// CHECK-NEXT: {{^}}func.func @extent(%x: !fusion.tensor<[99999999999999999999], f32>) {{[{]}}
// CHECK-NEXT: {{^}}                                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^{{$}}
// expected-error@+1 {{axis 0 has extent 99999999999999999999, too large: an extent must fit in a signed 64-bit integer (at most 9223372036854775807)}}
func.func @extent(%x: !fusion.tensor<[99999999999999999999], f32>) {
  func.return
}

// -----

// expected-error@+1 {{axis 1 has extent 9223372036854775808, too large}}
func.func @extent_just_too_large(%x: !fusion.tensor<[4, 9223372036854775808], f32>) {
  func.return
}

// -----

// expected-error@+1 {{device id 99999999999999999999999 is too large: a device id is a torch.distributed rank, a signed 32-bit integer (at most 2147483647)}}
func.func @device_id(%x: !fusion.tensor<[4], f32, mesh = [0, 99999999999999999999999]>) {
  func.return
}

// -----

// expected-error@+1 {{device id 2147483648 is too large}}
func.func @mesh_attribute() attributes {team = #fusion.mesh<[2147483648]>} {
  func.return
}

// -----

func.func @team(%x: !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, %y: !fusion.tensor<[2], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{device id 18446744073709551616 is too large}}
  %w = hir.allgather %x into %y team [0, 18446744073709551616] backend nccl : !fusion.tensor<[2], f32, mesh = [0, 1], axes = [didx]>, !fusion.tensor<[2], f32, mesh = [0, 1]>
  func.return
}

// -----

// Negative device ids and extents do not parse.
// expected-error@+1 {{Expected integer literal}}
func.func @negative_device(%x: !fusion.tensor<[4], f32, mesh = [-1]>) {
  func.return
}

// -----

// expected-error@+1 {{Expected integer literal or '?' as an extent}}
func.func @negative_extent(%x: !fusion.tensor<[-4], f32>) {
  func.return
}

// -----

func.func @largest(%x: !fusion.tensor<[9223372036854775807, ?], f32, mesh = [2147483647]>) {
  func.return
}
