// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// out = x - (the sum of x over axis 0): the kernel reduces the axis that its
// output streams, so no slice of %x holds what an iteration needs.

!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func private @kernel(%x: !s) -> !s {
  %r = fusion.sum %x [0] keepdim : !s -> !fusion.tensor<[1, ?], f32>
  %d = fusion.sub %x, %r : (!s, !fusion.tensor<[1, ?], f32>) -> !s
  func.return %d : !s
}

func.func @reduced_in_segment(%x: !s) -> !s {
  %d0 = hir.dim %x, 0 : !s
  %d1 = hir.dim %x, 1 : !s
  %o = hir.allocate(%d0, %d1) : !s
  // CHECK: [[# @LINE + 1]]:3: error: segment @kernel reduces axis 0 of operand 0 `input` (input #0 of @kernel) of type !fusion.tensor<[?, ?], f32, axes = [stream, _]> in fusion.sum, which is its stream axis
  hir.launch_kernel @kernel ins(%x : !s) outs(%o : !s)
  func.return %o : !s
}
