// nvFuser's Reduction (pr4147): a sum over axis 2, stream-parallel on axis 0.

!in = !fusion.tensor<[?, ?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @reduction(%in: !in) -> !out {
  %out = fusion.sum %in [2] : !in -> !out
  func.return %out : !out
}
