// nvFuser's Matmul_N (pr4147): [M, K] @ [K, N], stream-parallel on N.

!m = !fusion.tensor<[?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [_, stream]>

func.func @matmul_n(%a: !m, %b: !m) -> !out {
  %out = fusion.matmul %a, %b : (!m, !m) -> !out
  func.return %out : !out
}
