// RUN: not hir-opt --split-input-file %s -p stream-parallel 2>&1 | filecheck %s

// Slices drop their axis, and torch.matmul reads the last two axes of each operand as
// its matrix: without M, a batched lhs's last batch axis would become its M, which
// only works when the rhs has no batch axes.

!a = !fusion.tensor<[?, ?, ?], f32>
!o = !fusion.tensor<[?, ?, ?], f32, axes = [_, stream, _]>

func.func @matmul_m_batched(%a: !a, %b: !a) -> !o {
  %s = hir.dim %a, 0 : !a
  %m = hir.dim %a, 1 : !a
  %n = hir.dim %b, 2 : !a
  %c = hir.allocate(%s, %m, %n) : !o
  // CHECK: [[# @LINE + 1]]:3: error: the stream axis 1 of the output !fusion.tensor<[?, ?, ?], f32, axes = [_, stream, _]> of hir.matmul is its M axis, while both operands have batch axes: a matmul of the slices would not be a slice of the product
  hir.matmul ins(%a, %b : !a, !a) outs(%c : !o)
  func.return %c : !o
}

// -----

// Without N, a batched rhs's K would become its N.

!m = !fusion.tensor<[?, ?], f32>
!b = !fusion.tensor<[?, ?, ?], f32>
!o = !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]>

func.func @matmul_n_batched(%a: !m, %b: !b) -> !o {
  %s = hir.dim %b, 0 : !b
  %m = hir.dim %a, 0 : !m
  %n = hir.dim %b, 2 : !b
  %c = hir.allocate(%s, %m, %n) : !o
  // CHECK: [[# @LINE + 1]]:3: error: the stream axis 2 of the output !fusion.tensor<[?, ?, ?], f32, axes = [_, _, stream]> of hir.matmul is its N axis, while the rhs has batch axes
  hir.matmul ins(%a, %b : !m, !b) outs(%c : !o)
  func.return %c : !o
}
