// RUN: hir-opt %s --split-input-file --verify-diagnostics -p 'fusion-to-hir{backend=cuda}'
// RUN: not hir-opt %s -p 'fusion-to-hir{backend=ucx}' 2>&1 | filecheck %s --check-prefix=OPTION

// fusion-to-hir{backend=cuda} on a collective that has no copy-engine form is an error
// that names the op and says what to do.

func.func @sum_on_one_device_is_a_reduce(%x: !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>) -> !fusion.tensor<[4], f32, mesh = [0]> {
  // expected-error@+1 {{fusion.sum: fusion-to-hir{backend=cuda} asks the copy engines to move this hir.reduce, which has no copy-engine form (the copy engines move hir.allgather, hir.allreduce, hir.reduce_scatter only); lower it with backend=nccl}}
  %y = fusion.sum %x [0] : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]> -> !fusion.tensor<[4], f32, mesh = [0]>
  func.return %y : !fusion.tensor<[4], f32, mesh = [0]>
}

// -----

func.func @scatter(%x: !fusion.tensor<[2, 4], f32>) -> !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]> {
  // expected-error@+1 {{fusion.set: fusion-to-hir{backend=cuda} asks the copy engines to move this hir.scatter, which has no copy-engine form}}
  %y = fusion.set %x : !fusion.tensor<[2, 4], f32> -> !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
  func.return %y : !fusion.tensor<[2, 4], f32, mesh = [0, 1], axes = [didx, _]>
}

// OPTION: error: fusion-to-hir: unknown backend 'ucx'; expected one of nccl, cuda
