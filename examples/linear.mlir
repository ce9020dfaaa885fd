// A single-device linear with a bias: in [S, M, K], weight [N, K], bias [N] ->
// [Stream(S), M, N].

!in = !fusion.tensor<[?, ?, ?], f32>
!w = !fusion.tensor<[?, ?], f32>
!b = !fusion.tensor<[?], f32>
!out = !fusion.tensor<[?, ?, ?], f32, axes = [stream, _, _]>

func.func @linear(%in: !in, %w: !w, %b: !b) -> !out {
  %out = fusion.linear %in, %w, %b : (!in, !w, !b) -> !out
  func.return %out : !out
}
