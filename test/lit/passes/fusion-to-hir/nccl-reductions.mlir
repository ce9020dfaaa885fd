// RUN: hir-opt %s -p 'fusion-to-hir{backend=cuda nccl_reductions=true}' | filecheck %s

// fusion-to-hir{backend=cuda nccl_reductions=true}: the copy engines gather (their input
// symmetric), NCCL reduces, a reduce to one device too (which has no copy-engine form).

!varying = !fusion.tensor<[4, 8], f32, mesh = [0, 1, 2, 3], axes = [didx, _]>
!whole = !fusion.tensor<[4, 8], f32, mesh = [0, 1, 2, 3]>
!summed = !fusion.tensor<[8], f32, mesh = [0, 1, 2, 3]>
!on_one = !fusion.tensor<[8], f32, mesh = [0]>

func.func @gathered_and_summed(%x: !varying, %p: !varying) -> (!whole, !summed, !on_one) {
  %y = fusion.set %x : !varying -> !whole
  %s = fusion.sum %p [0] : !varying -> !summed
  %r = fusion.sum %p [0] : !varying -> !on_one
  func.return %y, %s, %r : !whole, !summed, !on_one
}

// CHECK:      %x_symmetric = hir.allocate() symmetric
// CHECK-NEXT: hir.copy ins(%x : {{.*}}) outs(%x_symmetric
// CHECK:      hir.allgather %x_symmetric into %y team [0, 1, 2, 3] backend cuda
// CHECK-NOT:  symmetric
// CHECK:      hir.allreduce %p into %s team [0, 1, 2, 3] op sum backend nccl
// CHECK:      hir.reduce %p into %r team [0, 1, 2, 3] root 0 op sum backend nccl
