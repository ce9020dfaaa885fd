// The axis a collective splits or fills holds one slice per member of its team in the
// other buffer's mesh: a known extent other than that number is refused. So are buffers
// whose known extents make a member receive more or fewer elements than are sent.
// RUN: hir-opt %s --split-input-file --verify-diagnostics

func.func @scatter_too_many_slices(%x: !fusion.tensor<[8, 3], f32>, %y: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>) {
  // expected-error@+1 {{hir.scatter splits axis 0 of its input, of extent 8, over the 2 member(s) of its team in its output's mesh, one slice each; the extent must be 2}}
  %w = hir.scatter %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[8, 3], f32>, !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>
  func.return
}

// -----

func.func @scatter_axis_out_of_range(%x: !fusion.tensor<[3], f32>, %y: !fusion.tensor<[3, 2], f32, mesh = [0, 1], axes = [_, didx]>) {
  // expected-error@+1 {{hir.scatter splits axis 1 of its input, but the input has rank 1}}
  %w = hir.scatter %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[3], f32>, !fusion.tensor<[3, 2], f32, mesh = [0, 1], axes = [_, didx]>
  func.return
}

// -----

func.func @gather_too_few_rows(%x: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, %y: !fusion.tensor<[1, 3], f32>) {
  // expected-error@+1 {{hir.gather fills axis 0 of its output, of extent 1, from the 2 member(s) of its team in its input's mesh, one slice each; the extent must be 2}}
  %w = hir.gather %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[1, 3], f32>
  func.return
}

// -----

// The root outside the input's mesh sends no slice.
func.func @gather_a_slice_from_the_root_outside_the_mesh(%x: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, %y: !fusion.tensor<[3, 3], f32, mesh = [2]>) {
  // expected-error@+1 {{hir.gather fills axis 0 of its output, of extent 3, from the 2 member(s) of its team in its input's mesh, one slice each; the extent must be 2}}
  %w = hir.gather %x into %y team [0, 1, 2] root 2 backend nccl : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[3, 3], f32, mesh = [2]>
  func.return
}

// -----

func.func @allgather_too_many_columns(%x: !fusion.tensor<[3, 2], f32, mesh = [0, 1], axes = [_, didx]>, %y: !fusion.tensor<[3, 4], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.allgather fills axis 1 of its output, of extent 4, from the 2 member(s) of its team in its input's mesh, one slice each; the extent must be 2}}
  %w = hir.allgather %x into %y team [0, 1] backend nccl : !fusion.tensor<[3, 2], f32, mesh = [0, 1], axes = [_, didx]>, !fusion.tensor<[3, 4], f32, mesh = [0, 1]>
  func.return
}

// -----

// The reduced axis (0) is not the input's: the scattered one is the output's didx axis, one further.
func.func @reduce_scatter_too_many_slices(%x: !fusion.tensor<[2, 3, 4], f32, mesh = [0, 1], axes = [didx, _, _]>, %y: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) {
  // expected-error@+1 {{hir.reduce_scatter splits axis 1 of its input, of extent 3, over the 2 member(s) of its team in its output's mesh, one slice each; the extent must be 2}}
  %w = hir.reduce_scatter %x into %y team [0, 1] op sum backend nccl : !fusion.tensor<[2, 3, 4], f32, mesh = [0, 1], axes = [didx, _, _]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  func.return
}

// -----

func.func @allgather_slices_of_another_size(%x: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, %y: !fusion.tensor<[2, 5], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.allgather moves 3 element(s) per slice of its input into 5 of its output; they must be as many}}
  %w = hir.allgather %x into %y team [0, 1] backend nccl : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[2, 5], f32, mesh = [0, 1]>
  func.return
}

// -----

func.func @send_recv_into_a_longer_buffer(%x: !fusion.tensor<[4], f32, mesh = [0]>, %y: !fusion.tensor<[8], f32, mesh = [1]>) {
  // expected-error@+1 {{hir.send_recv moves 4 element(s) of its input into 8 of its output; they must be as many}}
  %w = hir.send_recv %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[4], f32, mesh = [0]>, !fusion.tensor<[8], f32, mesh = [1]>
  func.return
}

// -----

func.func @broadcast_into_a_longer_buffer(%x: !fusion.tensor<[4], f32, mesh = [0]>, %y: !fusion.tensor<[2, 4], f32, mesh = [0, 1]>) {
  // expected-error@+1 {{hir.broadcast moves 4 element(s) of its input into 8 of its output; they must be as many}}
  %w = hir.broadcast %x into %y team [0, 1] root 0 backend nccl : !fusion.tensor<[4], f32, mesh = [0]>, !fusion.tensor<[2, 4], f32, mesh = [0, 1]>
  func.return
}

// -----

// Fitting extents, a `?` that only the inputs fix (Program.check_extents checks it), a
// team of two in a mesh of three, and an allreduce into fewer axes of the same elements verify.
func.func @fitting(%x: !fusion.tensor<[?, 3], f32>, %s: !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>,
                   %g: !fusion.tensor<[?, 3], f32>, %p: !fusion.tensor<[3, 2, 4], f32, mesh = [0, 1, 2], axes = [didx, _, _]>,
                   %r: !fusion.tensor<[3, 4], f32, mesh = [0, 1, 2], axes = [didx, _]>, %row: !fusion.tensor<[3], f32, mesh = [0, 1]>) {
  %w0 = hir.scatter %x into %s team [0, 1] root 0 backend nccl : !fusion.tensor<[?, 3], f32>, !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>
  %w1 = hir.gather %s into %g team [0, 1] root 0 backend nccl : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[?, 3], f32>
  %w2 = hir.reduce_scatter %p into %r team [0, 1] op sum backend nccl : !fusion.tensor<[3, 2, 4], f32, mesh = [0, 1, 2], axes = [didx, _, _]>, !fusion.tensor<[3, 4], f32, mesh = [0, 1, 2], axes = [didx, _]>
  %w3 = hir.allreduce %s into %row team [0, 1] op sum backend nccl : !fusion.tensor<[2, 3], f32, mesh = [0, 1], axes = [didx, _]>, !fusion.tensor<[3], f32, mesh = [0, 1]>
  func.return
}
