// RUN: not hir-opt %s -p stream-parallel 2>&1 | filecheck %s

// The output streams an axis that the sum reduces and keeps with extent 1: no slice
// of the input computes a slice of it.

!x = !fusion.tensor<[?, ?], f32>
!y = !fusion.tensor<[?, 1], f32, axes = [_, stream]>

func.func @stream_on_kept_axis(%x: !x) -> !y {
  %d0 = hir.dim %x, 0 : !x
  %y = hir.allocate(%d0) : !y
  // CHECK: [[# @LINE + 1]]:3: error: the stream axis 1 of the output !fusion.tensor<[?, 1], f32, axes = [_, stream]> of hir.reduction is an axis it reduces, kept with extent 1; no slice of the input computes a slice of it
  hir.reduction "sum" [1] keepdim ins(%x : !x) outs(%y : !y)
  func.return %y : !y
}
