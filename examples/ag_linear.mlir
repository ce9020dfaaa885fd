// pr3736's AG+GEMM overlap: a linear whose input is allgathered chunk by chunk.
// in [S, DIDx(D), M/(S*D), K], weight [N, K], bias [N] -> [Stream(S), D, M/(S*D), N].

!in = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!w = !fusion.tensor<[?, ?], bf16, mesh = [0, 1, 2, 3]>
!b = !fusion.tensor<[?], bf16, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[?, 4, ?, ?], bf16, mesh = [0, 1, 2, 3], axes = [stream, _, _, _]>

func.func @ag_linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}
