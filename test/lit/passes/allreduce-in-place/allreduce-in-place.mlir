// RUN: hir-opt %s -p allreduce-in-place | filecheck %s
// RUN: hir-opt %s -p allreduce-in-place > %t && hir-opt %t -p allreduce-in-place | diff %t -
// RUN: hir-opt %s -p allreduce-in-place,canonicalize | filecheck %s --check-prefix=FOLDED

// allreduce-in-place: the matmul whose product an NCCL allreduce sums writes it into the
// allreduce's output, seen with the product's type (an adopted `aten.alias`: a view), and
// the allreduce sums that buffer in place; the product's own buffer is gone.

!x = !fusion.tensor<[2, 6, 4], f32, mesh = [0, 1], axes = [didx, _, _]>
!w = !fusion.tensor<[2, 4, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
!p = !fusion.tensor<[2, 6, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
!y = !fusion.tensor<[6, 5], f32, mesh = [0, 1]>

// CHECK-LABEL: func.func @whole(
// CHECK-NEXT:    %y = hir.allocate() : !fusion.tensor<[6, 5], f32, mesh = [0, 1]>
// CHECK-NEXT:    %in_out = hir.allocate() : !fusion.tensor<[2, 6, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:    hir.aten "aten.alias.default"(%y) ins(%y : {{.*}}) outs(%in_out : {{.*}}) adopted [0]
// CHECK-NEXT:    hir.matmul ins(%x, %w : {{.*}}) outs(%in_out : {{.*}})
// CHECK-NEXT:    %work = hir.allreduce %in_out into %y team [0, 1] op sum backend nccl
// CHECK-NEXT:    hir.wait %work
// CHECK-NEXT:    func.return %y
func.func @whole(%x: !x, %w: !w) -> !y {
  %p = hir.allocate() : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p : !p)
  %y = hir.allocate() : !y
  %work = hir.allreduce %p into %y team [0, 1] op sum backend nccl : !p, !y
  hir.wait %work
  func.return %y : !y
}

// A stream loop's chunk, with dynamic extents (the output's `hir.dim`, which canonicalize
// folds into its allocation's size): the output's slice is made before the GEMM, which
// writes into it; the partial sums' buffer is gone.

!xs = !fusion.tensor<[?, 2, ?, 4], f32, mesh = [0, 1], axes = [_, didx, _, _]>
!xc = !fusion.tensor<[2, ?, 4], f32, mesh = [0, 1], axes = [didx, _, _]>
!ps = !fusion.tensor<[?, 2, ?, 5], f32, mesh = [0, 1], axes = [stream, didx, _, _]>
!pc = !fusion.tensor<[2, ?, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
!ys = !fusion.tensor<[?, ?, 5], f32, mesh = [0, 1], axes = [stream, _, _]>
!yc = !fusion.tensor<[?, 5], f32, mesh = [0, 1]>

// CHECK-LABEL: func.func @chunks(
// CHECK:         %y = hir.allocate(%n, %m) : !fusion.tensor<[?, ?, 5], f32, mesh = [0, 1], axes = [stream, _, _]>
// CHECK-NEXT:    scf.for %i = %c0 to %n step %c1 {
// CHECK-NEXT:      %x_i = hir.alias_select %x[0 = %i]
// CHECK-NEXT:      %y_i = hir.alias_select %y[0 = %i]
// CHECK-NEXT:      %[[M:[^ ]+]] = hir.dim %y_i, 0
// CHECK-NEXT:      %in_out = hir.allocate(%[[M]]) : !fusion.tensor<[2, ?, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
// FOLDED-LABEL: func.func @chunks(
// FOLDED:           %in_out = hir.allocate(%m) : !fusion.tensor<[2, ?, 5], f32, mesh = [0, 1], axes = [didx, _, _]>
// CHECK-NEXT:      hir.aten "aten.alias.default"(%y_i) ins(%y_i : {{.*}}) outs(%in_out : {{.*}}) adopted [0]
// CHECK-NEXT:      hir.matmul ins(%x_i, %w : {{.*}}) outs(%in_out : {{.*}})
// CHECK-NEXT:      %work = hir.allreduce %in_out into %y_i team [0, 1] op sum backend nccl
// CHECK-NEXT:      hir.wait %work
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %y
func.func @chunks(%x: !xs, %w: !w) -> !ys {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = hir.dim %x, 0 : !xs
  %m = hir.dim %x, 2 : !xs
  %p = hir.allocate(%n, %m) : !ps
  %y = hir.allocate(%n, %m) : !ys
  scf.for %i = %c0 to %n step %c1 {
    %x_i = hir.alias_select %x[0 = %i] : !xs -> !xc
    %p_i = hir.alias_select %p[0 = %i] : !ps -> !pc
    hir.matmul ins(%x_i, %w : !xc, !w) outs(%p_i : !pc)
    %y_i = hir.alias_select %y[0 = %i] : !ys -> !yc
    %work = hir.allreduce %p_i into %y_i team [0, 1] op sum backend nccl : !pc, !yc
    hir.wait %work
  }
  func.return %y : !ys
}

// Left alone: the copy engines' allreduce (its peers read the input in place, from
// symmetric memory); a product that something else reads; a write between the GEMM and
// the allreduce; an input whose device axis is not its first.

// CHECK-LABEL: func.func @copy_engines(
// CHECK:         hir.matmul ins(%x, %w : {{.*}}) outs(%p : {{.*}})
// CHECK:         hir.allreduce %p into %y
func.func @copy_engines(%x: !x, %w: !w) -> !y {
  %p = hir.allocate() symmetric : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p : !p)
  %y = hir.allocate() : !y
  %work = hir.allreduce %p into %y team [0, 1] op sum backend cuda : !p, !y
  hir.wait %work
  func.return %y : !y
}

// CHECK-LABEL: func.func @product_read_again(
// CHECK:         hir.matmul ins(%x, %w : {{.*}}) outs(%p : {{.*}})
// CHECK:         hir.allreduce %p into %y
func.func @product_read_again(%x: !x, %w: !w) -> (!y, !p) {
  %p = hir.allocate() : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p : !p)
  %y = hir.allocate() : !y
  %work = hir.allreduce %p into %y team [0, 1] op sum backend nccl : !p, !y
  hir.wait %work
  func.return %y, %p : !y, !p
}

// CHECK-LABEL: func.func @write_between(
// CHECK:         hir.matmul ins(%x, %w : {{.*}}) outs(%p : {{.*}})
// CHECK:         hir.allreduce %p into %y
func.func @write_between(%x: !x, %w: !w, %v: !y) -> !y {
  %p = hir.allocate() : !p
  hir.matmul ins(%x, %w : !x, !w) outs(%p : !p)
  %y = hir.allocate() : !y
  hir.copy ins(%v : !y) outs(%y : !y)
  %work = hir.allreduce %p into %y team [0, 1] op sum backend nccl : !p, !y
  hir.wait %work
  func.return %y : !y
}

!pt = !fusion.tensor<[6, 2, 5], f32, mesh = [0, 1], axes = [_, didx, _]>
!xt = !fusion.tensor<[6, 2, 4], f32, mesh = [0, 1], axes = [_, didx, _]>

// CHECK-LABEL: func.func @device_axis_inside(
// CHECK:         hir.allreduce %p into %y
func.func @device_axis_inside(%x: !xt, %w: !w) -> !y {
  %p = hir.allocate() : !pt
  hir.matmul ins(%x, %w : !xt, !w) outs(%p : !pt)
  %y = hir.allocate() : !y
  %work = hir.allreduce %p into %y team [0, 1] op sum backend nccl : !pt, !y
  hir.wait %work
  func.return %y : !y
}

!pd = !fusion.tensor<[?, 6, 5], f32, mesh = [0, 1], axes = [didx, _, _]>

// CHECK-LABEL: func.func @device_axis_of_unknown_extent(
// CHECK:         hir.allreduce %p into %y
func.func @device_axis_of_unknown_extent(%x: !x, %w: !w, %n: index) -> !y {
  %p = hir.allocate(%n) : !pd
  hir.matmul ins(%x, %w : !x, !w) outs(%p : !pd)
  %y = hir.allocate() : !y
  %work = hir.allreduce %p into %y team [0, 1] op sum backend nccl : !pd, !y
  hir.wait %work
  func.return %y : !y
}
