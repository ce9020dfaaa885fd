// RUN: hir-opt %s -p sum-in-matmul | filecheck %s
// RUN: hir-opt %s -p sum-in-matmul > %t && hir-opt %t -p sum-in-matmul | diff %t -

// sum-in-matmul: a kernel that only adds two products, one of them a GEMM's made for that
// sum alone, becomes that GEMM adding its product into the other (`hir.matmul
// accumulate`); the kernel, its segment, and the buffers of the later product and of the
// sum are gone, and the sum's readers read the other product's buffer.

!x = !fusion.tensor<[6, 4], f32>
!w = !fusion.tensor<[4, 5], f32>
!y = !fusion.tensor<[6, 5], f32>

func.func private @add(%a: !y, %b: !y) -> !y {
  %sum = fusion.add %a, %b : (!y, !y) -> !y
  func.return %sum : !y
}

// The input gradient of two projections: dx = dq @ wq + dk @ wk.
// CHECK-NOT:   func.func private @add(
// CHECK-LABEL: func.func @two_projections(
// CHECK-NEXT:    %p = hir.allocate() : !fusion.tensor<[6, 5], f32>
// CHECK-NEXT:    hir.matmul ins(%dq, %wq : {{.*}}) outs(%p : {{.*}})
// CHECK-NEXT:    hir.matmul accumulate ins(%dk, %wk : {{.*}}) outs(%p : {{.*}})
// CHECK-NEXT:    func.return %p
func.func @two_projections(%dq: !x, %wq: !w, %dk: !x, %wk: !w) -> !y {
  %p = hir.allocate() : !y
  hir.matmul ins(%dq, %wq : !x, !w) outs(%p : !y)
  %q = hir.allocate() : !y
  hir.matmul ins(%dk, %wk : !x, !w) outs(%q : !y)
  %s = hir.allocate() : !y
  hir.launch_kernel @add ins(%p, %q : !y, !y) outs(%s : !y)
  func.return %s : !y
}

// A pipelined loop's iteration: each chunk's sum, then its reduce-scatter. The GEMM adds
// into the chunk of the other product, which the reduce-scatter then reads.

!xs = !fusion.tensor<[2, 3, 4], f32, mesh = [0, 1]>
!ys = !fusion.tensor<[2, 3, 5], f32, mesh = [0, 1], axes = [stream, _, _]>
!yc = !fusion.tensor<[3, 5], f32, mesh = [0, 1]>
!xc = !fusion.tensor<[3, 4], f32, mesh = [0, 1]>
!wm = !fusion.tensor<[4, 5], f32, mesh = [0, 1]>
!rs = !fusion.tensor<[2, 5], f32, mesh = [0, 1], axes = [didx, _]>
!rss = !fusion.tensor<[2, 2, 5], f32, mesh = [0, 1], axes = [stream, didx, _]>

func.func private @add_chunk(%a: !yc, %b: !yc) -> !yc {
  %sum = fusion.add %a, %b : (!yc, !yc) -> !yc
  func.return %sum : !yc
}

// CHECK-LABEL: func.func @in_a_loop(
// CHECK:         scf.for %i =
// CHECK-NEXT:      %a = hir.alias_select %x[0 = %i]
// CHECK-NEXT:      %p_i = hir.alias_select %p[0 = %i]
// CHECK-NEXT:      hir.matmul ins(%a, %w : {{.*}}) outs(%p_i : {{.*}})
// CHECK-NEXT:      %b = hir.alias_select %z[0 = %i]
// CHECK-NEXT:      %[[INTO:[^ ]+]] = hir.alias_select %p[0 = %i]
// CHECK-NEXT:      hir.matmul accumulate ins(%b, %w : {{.*}}) outs(%[[INTO]] : {{.*}})
// CHECK-NEXT:      %s_i = hir.alias_select %p[0 = %i]
// CHECK-NEXT:      %r_i = hir.alias_select %r[0 = %i]
// CHECK-NEXT:      %work = hir.reduce_scatter %s_i into %r_i
func.func @in_a_loop(%x: !xs, %z: !xs, %w: !wm) -> !rss {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %p = hir.allocate() : !ys
  %q = hir.allocate() : !ys
  %s = hir.allocate() : !ys
  %r = hir.allocate() : !rss
  scf.for %i = %c0 to %c2 step %c1 {
    %a = hir.alias_select %x[0 = %i] : !xs -> !xc
    %p_i = hir.alias_select %p[0 = %i] : !ys -> !yc
    hir.matmul ins(%a, %w : !xc, !wm) outs(%p_i : !yc)
    %b = hir.alias_select %z[0 = %i] : !xs -> !xc
    %q_i = hir.alias_select %q[0 = %i] : !ys -> !yc
    hir.matmul ins(%b, %w : !xc, !wm) outs(%q_i : !yc)
    %s_i = hir.alias_select %s[0 = %i] : !ys -> !yc
    hir.launch_kernel @add_chunk ins(%p_i, %q_i : !yc, !yc) outs(%s_i : !yc)
    %r_i = hir.alias_select %r[0 = %i] : !rss -> !rs
    %work = hir.reduce_scatter %s_i into %r_i team [0, 1] op sum backend nccl : !yc, !rs
    hir.wait %work
  }
  func.return %r : !rss
}

// Kept: the other product is read after the sum (it would hold the sum), or the GEMM's
// product is read by another op too.
func.func private @add_kept(%a: !y, %b: !y) -> !y {
  %sum = fusion.add %a, %b : (!y, !y) -> !y
  func.return %sum : !y
}

// CHECK-LABEL: func.func @kept(
// CHECK-NOT:     accumulate
// CHECK:         func.return
func.func @kept(%dq: !x, %wq: !w, %dk: !x, %wk: !w) -> (!y, !y, !y, !y) {
  %p = hir.allocate() : !y
  hir.matmul ins(%dq, %wq : !x, !w) outs(%p : !y)
  %q = hir.allocate() : !y
  hir.matmul ins(%dk, %wk : !x, !w) outs(%q : !y)
  %s = hir.allocate() : !y
  hir.launch_kernel @add_kept ins(%p, %q : !y, !y) outs(%s : !y)
  %t = hir.allocate() : !y
  hir.matmul ins(%dq, %wq : !x, !w) outs(%t : !y)
  %u = hir.allocate() : !y
  hir.matmul ins(%dk, %wk : !x, !w) outs(%u : !y)
  %v = hir.allocate() : !y
  hir.launch_kernel @add_kept ins(%t, %u : !y, !y) outs(%v : !y)
  func.return %s, %p, %v, %u : !y, !y, !y, !y
}

// Kept: in a loop, an op reads the other product's buffer whole (a later iteration would
// read the sums of the earlier ones where it read their products).
// CHECK-LABEL: func.func @read_whole_in_a_loop(
// CHECK-NOT:     accumulate
// CHECK:         func.return
func.func @read_whole_in_a_loop(%x: !xs, %z: !xs, %w: !wm) -> (!rss, !ys) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %p = hir.allocate() : !ys
  %q = hir.allocate() : !ys
  %s = hir.allocate() : !ys
  %r = hir.allocate() : !rss
  %seen = hir.allocate() : !ys
  scf.for %i = %c0 to %c2 step %c1 {
    %a = hir.alias_select %x[0 = %i] : !xs -> !xc
    %p_i = hir.alias_select %p[0 = %i] : !ys -> !yc
    hir.matmul ins(%a, %w : !xc, !wm) outs(%p_i : !yc)
    hir.copy ins(%p : !ys) outs(%seen : !ys)
    %b = hir.alias_select %z[0 = %i] : !xs -> !xc
    %q_i = hir.alias_select %q[0 = %i] : !ys -> !yc
    hir.matmul ins(%b, %w : !xc, !wm) outs(%q_i : !yc)
    %s_i = hir.alias_select %s[0 = %i] : !ys -> !yc
    hir.launch_kernel @add_chunk ins(%p_i, %q_i : !yc, !yc) outs(%s_i : !yc)
    %r_i = hir.alias_select %r[0 = %i] : !rss -> !rs
    %work = hir.reduce_scatter %s_i into %r_i team [0, 1] op sum backend nccl : !yc, !rs
    hir.wait %work
  }
  func.return %r, %seen : !rss, !ys
}
