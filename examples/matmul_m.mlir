// nvFuser's Matmul_M (pr4147): [M, K] @ [K, N], stream-parallel on M.

!m = !fusion.tensor<[?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @matmul_m(%a: !m, %b: !m) -> !out {
  %out = fusion.matmul %a, %b : (!m, !m) -> !out
  func.return %out : !out
}
