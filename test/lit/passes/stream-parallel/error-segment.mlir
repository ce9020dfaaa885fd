// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// out[i, j] = x[i, j] + y[j] + y[i]: the kernel ties both axes of its output to the
// axis of %y, so slicing the output along its stream axis slices it along both.

!m = !fusion.tensor<[?, ?], f32>
!s = !fusion.tensor<[?, ?], f32, axes = [stream, _]>
!v = !fusion.tensor<[?], f32>

func.func private @kernel(%x: !m, %y: !v) -> !s {
  %a = fusion.add %x, %y : (!m, !v) -> !m
  %w = fusion.broadcast %y [1] : !v -> !fusion.tensor<[?, 1], f32>
  %b = fusion.add %a, %w : (!m, !fusion.tensor<[?, 1], f32>) -> !s
  func.return %b : !s
}

func.func @tied_axes(%x: !m, %y: !v) -> !s {
  %d0 = hir.dim %x, 0 : !m
  %d1 = hir.dim %x, 1 : !m
  %o = hir.allocate(%d0, %d1) : !s
  // CHECK: [[# @LINE + 1]]:3: error: segment @kernel relates two axes of its output !fusion.tensor<[?, ?], f32, axes = [stream, _]> to each other
  hir.launch_kernel @kernel ins(%x, %y : !m, !v) outs(%o : !s)
  func.return %o : !s
}
