// nvFuser's MultiDeviceExecutorLowerStreamTest.SingleSetOp (pr4147): a copy whose
// output is stream-parallel on axis 0.

!in = !fusion.tensor<[?, ?], f32>
!out = !fusion.tensor<[?, ?], f32, axes = [stream, _]>

func.func @single_set(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}
