// nvFuser's SingleBinaryOp (pr4147): an addition, stream-parallel on axis 0.

!in = !fusion.tensor<[?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @single_binary(%a: !in, %b: !in) -> !out {
  %out = fusion.add %a, %b : (!in, !in) -> !out
  func.return %out : !out
}
