// RUN: hir-opt %s -p buffer-layouts | filecheck %s
// RUN: hir-opt %s -p buffer-layouts > %t && hir-opt %t -p buffer-layouts | diff %t -

// buffer-layouts allocates a buffer that a permute reads in the permute's order, so that
// the permute's result is one block and the reshape after it a view: a pipelined loop's
// product, chunk `d` holding the rows `d` of both sequences (`[D, B, s, width]`), read
// back in sequence order (`[B, D, s, width]`, then `[B, D s, width]`). The GEMMs write
// their chunks as strided views; the copy that forward-buffers forwarded is followed.

!x = !fusion.tensor<[2, 3, 4], f32>
!w = !fusion.tensor<[4, 5], f32>
!s = !fusion.tensor<[2, 2, 3, 5], f32, axes = [stream, _, _, _]>
!t = !fusion.tensor<[2, 2, 3, 5], f32>
!chunk = !fusion.tensor<[2, 3, 5], f32>
!seq = !fusion.tensor<[2, 6, 5], f32>

// CHECK-LABEL: func.func @permuted(
// CHECK:         %s = hir.allocate() order [1, 0, 2, 3] : !fusion.tensor<[2, 2, 3, 5], f32, axes = [stream, _, _, _]>
// CHECK:         %whole = hir.allocate() : !fusion.tensor<[2, 2, 3, 5], f32>
func.func @permuted(%x: !x, %w: !w) -> !seq {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %s = hir.allocate() : !s
  scf.for %i = %c0 to %c2 step %c1 {
    %chunk = hir.alias_select %s[0 = %i] : !s -> !chunk
    hir.matmul ins(%x, %w : !x, !w) outs(%chunk : !chunk)
  }
  %whole = hir.allocate() : !t
  hir.copy ins(%s : !s) outs(%whole : !t) forwards_source
  hir.deallocate %s : !s
  %p = hir.allocate() : !t
  hir.aten "aten.permute.default"(%whole, [1, 0, 2, 3]) ins(%whole : !t) outs(%p : !t) adopted [0]
  hir.deallocate %whole : !t
  %r = hir.allocate() : !seq
  hir.aten "aten.reshape.default"(%p, [2, 6, 5]) ins(%p : !t) outs(%r : !seq) adopted [0]
  hir.deallocate %p : !t
  func.return %r : !seq
}

// Not where the layout would show: a communication sends the buffer (its pieces must be
// blocks), a kernel of the program writes it, it is returned, or the copy was not
// forwarded (the permute reads the copy, a buffer of its own, laid out in order).
// CHECK-LABEL: func.func @kept(
// CHECK-NOT:     order
// CHECK:         func.return
func.func @kept(%x: !x, %w: !w, %y: !t) -> (!seq, !t, !t, !seq) {
  %sent = hir.allocate() : !t
  hir.pointwise "neg" ins(%y : !t) outs(%sent : !t)
  %work = hir.allreduce %sent into %sent team [0] op sum backend nccl : !t, !t
  hir.wait %work
  %p = hir.allocate() : !t
  hir.aten "aten.permute.default"(%sent, [1, 0, 2, 3]) ins(%sent : !t) outs(%p : !t) adopted [0]
  %r = hir.allocate() : !seq
  hir.aten "aten.reshape.default"(%p, [2, 6, 5]) ins(%p : !t) outs(%r : !seq)
  %returned = hir.allocate() : !t
  hir.pointwise "exp" ins(%y : !t) outs(%returned : !t)
  %q = hir.allocate() : !t
  hir.aten "aten.permute.default"(%returned, [1, 0, 2, 3]) ins(%returned : !t) outs(%q : !t)
  %copied = hir.allocate() : !t
  hir.copy ins(%y : !t) outs(%copied : !t)
  %u = hir.allocate() : !t
  hir.aten "aten.permute.default"(%copied, [1, 0, 2, 3]) ins(%copied : !t) outs(%u : !t) adopted [0]
  %v = hir.allocate() : !seq
  hir.aten "aten.reshape.default"(%u, [2, 6, 5]) ins(%u : !t) outs(%v : !seq)
  func.return %r, %returned, %q, %v : !seq, !t, !t, !seq
}

// A generated kernel walks its buffers through their strides: the kernel of a rotary
// embedding writes the queries in the order of the heads' transpose that reads them
// (`aten.transpose.int`, a permute of two axes), which is then one block.
!q = !fusion.tensor<[2, 2, 3, 4], f32>
!heads = !fusion.tensor<[2, 3, 2, 4], f32>
func.func private @rotary_segment(%x: !q) -> !q {
  %r = fusion.rotate_half %x : !q -> !q
  func.return %r : !q
}
// CHECK-LABEL: func.func @transposed_after_a_kernel(
// CHECK:         %q = hir.allocate() order [0, 2, 1, 3] : !fusion.tensor<[2, 2, 3, 4], f32>
func.func @transposed_after_a_kernel(%x: !q) -> !heads {
  %q = hir.allocate() : !q
  hir.launch_kernel @rotary_segment ins(%x : !q) outs(%q : !q)
  %t = hir.allocate() : !heads
  hir.aten "aten.transpose.int"(%q, 1, 2) ins(%q : !q) outs(%t : !heads) adopted [0]
  hir.deallocate %q : !q
  func.return %t : !heads
}
